"""One engine lifecycle: ``load`` -> ``warmup`` -> ``run`` or ``stream`` -> ``unload``.

``backends.create_backend`` makes every backend from ``EngineOptions``; ``health`` answers at
any time; ``load``, ``warmup`` and ``unload`` block, so the worker calls them off the event loop on
the engine's cores (``backends.start``). Failures raise; nothing returns ``False``. A backend
runs the batches the batcher closes (``BatchBackend``: embeddings, tensors) or streams
sequences it batches itself (``StreamBackend``: generation).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from kiln_runtimes._batch_types import BatchResult
    from kiln_runtimes.protocol import GenerateChunk, GenerateRequest, ModelManifest

PREFILL_CHUNK = 128
"""Prompt tokens a generation step prefills while nothing decodes (and the prefix cache's block)."""
DECODING_PREFILL = 24
"""Prompt tokens a generation step prefills while sequences decode, by default
(``EngineOptions.decoding_prefill``; from 2 to ``PREFILL_CHUNK``)."""
MIN_DECODING_PREFILL = 2
"""A 1-token chunk cut from a longer prompt changes its logits (docs/llm-engine.md)."""


@dataclass(frozen=True, slots=True)
class EngineOptions:
    """How the worker runs an engine (from its settings); each backend reads what it uses."""

    threads: int = 0
    """Intra-op threads (0: the backend's default, one per core)."""
    cpus: frozenset[int] | None = None
    """Cores of the engine's threads (``None``: any)."""
    max_batch_size: int = 32
    """Items per batch (warmup runs the largest), or sequences decoded at once."""
    optimized: bool = False
    """The model is a compiled engine, already graph-optimized (``compile``)."""
    adapter_slots: int = 0
    """LoRA adapters held at once (generation)."""
    adapter_rank: int = 16
    """Columns of one adapter slot."""
    prefix_cache_bytes: int = 0
    """Memory for KV blocks of prompt prefixes reused across requests (generation; 0: none)."""
    decoding_prefill: int = DECODING_PREFILL
    """Prompt tokens prefilled per step while sequences decode (generation): each running
    stream's next token waits for that step. Nothing decoding, a step prefills up to
    ``PREFILL_CHUNK``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PrefixStats:
    """A generation backend's prefix cache: blocks looked up (hit or miss) and held."""

    hit_blocks: int
    miss_blocks: int
    evicted_blocks: int
    blocks: int
    bytes: int
    max_bytes: int
    block_tokens: int


@dataclass(frozen=True, slots=True)
class EngineHealth:
    """What a backend reports of itself; the counts are a streaming backend's."""

    loaded: bool
    running: int = 0
    """Sequences being decoded."""
    waiting: int = 0
    """Sequences waiting for a slot."""
    adapters_in_slots: int = 0
    adapters_in_memory: int = 0
    prefix_cache: PrefixStats | None = None
    """``None``: the backend keeps no prefix cache."""


class Stop(Protocol):
    """One run's stop handle (ONNX Runtime's ``RunOptions``): ``terminate`` set from another
    thread makes the run raise at its next operator (preemption)."""

    terminate: bool


@runtime_checkable
class EngineBackend(Protocol):
    """The lifecycle every engine backend has."""

    def load(self, model_dir: Path, manifest: ModelManifest) -> None:
        """Open the model ``manifest.model_file`` names, confined to ``model_dir``."""
        ...

    def warmup(self) -> None:
        """Run synthetic work so the first request finds kernels and buffers ready."""
        ...

    def health(self) -> EngineHealth: ...

    def unload(self) -> None:
        """Release the engine; a streaming backend's open streams raise."""
        ...


@runtime_checkable
class BatchBackend(EngineBackend, Protocol):
    """Runs the batches the worker's batcher closes, on the batcher's threads."""

    def stop_handle(self) -> Stop:
        """A fresh ``Stop`` for one ``run``."""
        ...

    def run(self, inputs: list[Any], stop: Stop | None = None) -> BatchResult:
        """Run one input per item (token ids, or a row of named tensors); results in order."""
        ...


@runtime_checkable
class StreamBackend(EngineBackend, Protocol):
    """Batches sequences itself (continuous batching); called on the event loop."""

    def stream(self, request: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        """Yield chunks of new token ids; closing the iterator cancels the sequence.
        Raises ``ValueError`` for a request this model cannot take."""
        ...
