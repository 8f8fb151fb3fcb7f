"""Backend lifecycles: ``load`` -> ``warmup`` -> ``run``/``stream`` -> ``unload``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    import numpy as np

    from kiln_runtimes.protocol import GenerateChunk, GenerateRequest, ModelManifest


class EmbeddingBackend(Protocol):
    """Sentence embeddings over a padded batch; ``run`` is synchronous and called off the loop."""

    def load(self, model_dir: Path, manifest: ModelManifest, threads: int) -> None: ...

    def warmup(self) -> None: ...

    def stopper(self) -> Any:
        """A fresh stop handle for one ``run`` (``batcher.Stop``)."""
        ...

    def run(self, input_ids: list[list[int]], stop: Any = None) -> np.ndarray:
        """Embed unpadded token-id sequences; returns float32 ``[len(input_ids), dimensions]``.
        Setting ``stop.terminate`` from another thread makes it raise early."""
        ...

    def unload(self) -> None: ...


class GenerationBackend(Protocol):
    """Continuous-batching text generation over token ids."""

    async def load(self, model_dir: Path, manifest: ModelManifest, max_sequences: int) -> None: ...

    def stream(self, request: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        """Yield chunks of new token ids; closing the iterator cancels the sequence."""
        ...

    def running(self) -> int: ...

    def waiting(self) -> int: ...

    def adapters(self) -> tuple[int, int]:
        """LoRA adapters ``(in slots, in memory)``; ``(0, 0)`` without adapter slots."""
        ...

    async def unload(self) -> None: ...


class TensorBackend(Protocol):
    """Named tensors batched along dim 0; ``run`` is synchronous and called off the loop."""

    def load(
        self,
        model: Path,
        manifest: ModelManifest,
        threads: int,
        *,
        optimized: bool,
        providers: list[tuple[str, dict[str, str]]] | None = None,
    ) -> None: ...

    def warmup(self, max_batch_size: int) -> None: ...

    def stopper(self) -> Any:
        """A fresh stop handle for one ``run`` (``batcher.Stop``)."""
        ...

    def run(
        self, rows: list[dict[str, np.ndarray]], stop: Any = None
    ) -> list[dict[str, np.ndarray]]:
        """Run one row per item; returns each item's named outputs, in order. Setting
        ``stop.terminate`` from another thread makes it raise early."""
        ...

    def unload(self) -> None: ...
