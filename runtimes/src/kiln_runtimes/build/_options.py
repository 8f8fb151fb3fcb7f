"""What a build is asked for, and the one error a bad input raises."""

from __future__ import annotations

from typing import Literal

import msgspec

from kiln_runtimes.protocol import BuildFailure, Task

Precision = Literal["int4", "int8", "fp16", "fp32"]
Target = Literal["cpu", "cuda"]
PRECISIONS: tuple[Precision, ...] = ("int4", "int8", "fp16", "fp32")
TARGETS: tuple[Target, ...] = ("cpu", "cuda")
BYTES_PER_PARAMETER: dict[str, float] = {"int4": 0.5, "int8": 1.0, "fp16": 2.0, "fp32": 4.0}


class BuildOptions(msgspec.Struct, frozen=True, kw_only=True):
    """A build's settings; ``precision=None`` means int8 for generation, fp32 for embeddings."""

    task: Task | None = None
    precision: Precision | None = None
    target: Target = "cpu"
    name: str | None = None
    max_memory_bytes: int | None = None
    prune_lm_head: bool = False
    """Generation graphs compute logits for the last position only (og.Engine cannot run them)."""
    accuracy_tokens: int = 32
    source_label: str = ""
    """What the manifest's ``source`` says; the source path when empty."""


class BuildError(Exception):
    """The input cannot be built: why, in which file, which field (exit status 2)."""

    def __init__(self, message: str, *, file: str | None = None, field: str | None = None):
        super().__init__(message)
        self.file = file
        self.field = field

    def failure(self) -> BuildFailure:
        """The JSON error line."""
        return BuildFailure(error=str(self), file=self.file, field=self.field)


def check_generate_precision(precision: str, target: str) -> None:
    """Refuse a combination whose graph does not run: the builder's fp16 CPU graph (0.18) fails
    at its second decode step in onnxruntime (a shape clash at an inserted Cast)."""
    if precision == "fp16" and target == "cpu":
        raise BuildError(
            "fp16 generation graphs are for --target cuda; on cpu build fp32, int8 or int4",
            field="precision",
        )


def memory_needed(parameters: int, precision: str) -> int:
    """Bytes the built weights take: parameter count x bytes per parameter of ``precision``."""
    return int(parameters * BYTES_PER_PARAMETER[precision])


def check_memory(parameters: int, precision: str, limit: int | None, file: str) -> None:
    """Refuse a model whose built weights would not fit in ``limit`` bytes."""
    if limit is None:
        return
    needed = memory_needed(parameters, precision)
    if needed > limit:
        raise BuildError(
            f"{parameters:,} parameters x {BYTES_PER_PARAMETER[precision]:g} bytes ({precision}) "
            f"= {needed:,} bytes, over the memory limit of {limit:,} bytes",
            file=file,
            field="max_memory_bytes",
        )
