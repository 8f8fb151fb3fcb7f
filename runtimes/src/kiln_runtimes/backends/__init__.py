"""Engine backends, one lifecycle (``base``), chosen by name; heavy libraries (onnxruntime,
onnxruntime_genai, tensorrt) are imported only inside their backend's module."""

from __future__ import annotations

import importlib
import time
from typing import TYPE_CHECKING

from kiln_runtimes import cpus

if TYPE_CHECKING:
    from pathlib import Path

    from kiln_runtimes.backends.base import (
        BatchBackend,
        EngineBackend,
        EngineOptions,
        StreamBackend,
    )
    from kiln_runtimes.protocol import ModelManifest

BACKENDS: dict[tuple[str, str], str] = {
    ("embeddings", "onnxruntime"): "kiln_runtimes.backends.onnx_embed:OnnxEmbeddingBackend",
    ("tensor", "onnxruntime"): "kiln_runtimes.backends.onnx_tensor:OnnxTensorBackend",
    ("tensor", "tensorrt"): "kiln_runtimes.backends.onnx_tensor:OnnxTensorBackend",
    ("generate", "onnxruntime-genai"): "kiln_runtimes.backends.genai:GenAIGenerationBackend",
}
"""(task, engine) -> ``module:class`` of its backend."""


def create_backend(manifest: ModelManifest, options: EngineOptions) -> BatchBackend | StreamBackend:
    """The backend for a manifest's task and engine, not loaded yet; ``ValueError`` if none."""
    name = BACKENDS.get((manifest.task, manifest.engine))
    if name is None:
        raise ValueError(f"no {manifest.task} backend for engine {manifest.engine!r}")
    module, _, cls = name.partition(":")
    backend: BatchBackend | StreamBackend = getattr(importlib.import_module(module), cls)(options)
    return backend


async def start(
    backend: EngineBackend, model_dir: Path, manifest: ModelManifest, on: frozenset[int] | None
) -> float:
    """Load and warm up ``backend`` off the event loop, on the cores ``on`` (``None``: any): an
    engine's thread pool created there inherits them. Returns the warm-up's seconds."""
    await cpus.run_on(on, backend.load, model_dir, manifest)
    started = time.perf_counter()
    await cpus.run_on(on, backend.warmup)
    return time.perf_counter() - started
