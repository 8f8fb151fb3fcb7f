"""Compiled-engine cache keys and lookups (pure: no engine library is imported here).

An engine is a store tree built from a model artifact for one target. It is cached under the
sha256 of (artifact digest, target, precision, hardware, library versions), so a warm start never
recompiles and a library upgrade or a different CPU/GPU never reuses a stale engine.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import msgspec

from kiln_runtimes._hardware import hardware, library_versions
from kiln_runtimes.protocol import CompileReport

if TYPE_CHECKING:
    from pathlib import Path

    from kiln_runtimes.store import ArtifactStore

Target = Literal["cpu", "cuda", "tensorrt"]
Precision = Literal["fp32", "fp16", "int8"]
TARGETS: tuple[Target, ...] = ("cpu", "cuda", "tensorrt")
PRECISIONS: dict[Target, tuple[Precision, ...]] = {
    "cpu": ("fp32", "int8"),
    "cuda": ("fp32", "fp16"),
    "tensorrt": ("fp32", "fp16"),
}
ENGINE_MODEL = "model.onnx"
REPORT_NAME = "report.json"


@dataclass(frozen=True, slots=True)
class EngineKey:
    """What an engine depends on; ``digest`` names it in the cache."""

    artifact_digest: str
    target: Target
    precision: Precision
    hardware: str
    libraries: tuple[tuple[str, str], ...]

    @property
    def digest(self) -> str:
        """``sha256:<hex>`` of the canonical JSON of every field."""
        body = msgspec.json.encode(
            [self.artifact_digest, self.target, self.precision, self.hardware, self.libraries]
        )
        return "sha256:" + hashlib.sha256(body).hexdigest()


def validate_target(target: str, precision: str) -> tuple[Target, Precision]:
    """Check a (target, precision) pair; raises ``ValueError`` naming what is supported."""
    if target not in PRECISIONS:
        raise ValueError(f"unknown target {target!r}; one of {', '.join(TARGETS)}")
    allowed = PRECISIONS[target]
    if precision not in allowed:
        raise ValueError(f"target {target} supports precision {', '.join(allowed)}")
    return target, precision


def engine_key(artifact_digest: str, target: Target, precision: Precision) -> EngineKey:
    """The cache key of an engine for this machine and these libraries."""
    return EngineKey(artifact_digest, target, precision, hardware(target), library_versions(target))


class EngineCache:
    """Engine key -> engine tree, recorded as refs in the artifact store."""

    def __init__(self, store: ArtifactStore) -> None:
        self.store = store

    def lookup(self, key: EngineKey) -> tuple[Path, CompileReport] | None:
        """The cached engine folder and the report it was built with, or None."""
        ref = self.store.get_bytes(_ref(key))
        if ref is None:
            return None
        report = msgspec.json.decode(ref, type=CompileReport)
        if not self.store.has(report.engine_digest):
            return None
        return self.store.path(report.engine_digest), report

    def record(self, key: EngineKey, report: CompileReport) -> None:
        """Remember a built engine under its key."""
        self.store.put_bytes(_ref(key), msgspec.json.encode(report))


def _ref(key: EngineKey) -> str:
    return f"engines/{key.digest.removeprefix('sha256:')}.json"
