"""Engine backends, chosen by name; heavy libraries are imported only inside their module."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kiln_runtimes.backends.base import EmbeddingBackend, GenerationBackend, TensorBackend
    from kiln_runtimes.protocol import ModelManifest


def get_embedding_backend(manifest: ModelManifest) -> EmbeddingBackend:
    """Return the embeddings backend for a manifest's engine."""
    if manifest.engine == "onnxruntime":
        from kiln_runtimes.backends.onnx_embed import OnnxEmbeddingBackend

        return OnnxEmbeddingBackend()
    raise ValueError(f"no embeddings backend for engine {manifest.engine!r}")


def get_generation_backend(
    manifest: ModelManifest, *, threads: int = 0, cpus: frozenset[int] | None = None,
    adapter_slots: int = 0, adapter_rank: int = 16,
) -> GenerationBackend:  # fmt: skip
    """Return the generation backend for a manifest's engine, its engine on ``threads`` threads
    (0: one per core) on ``cpus`` (``None``: any core), holding ``adapter_slots`` LoRA adapters
    of up to ``adapter_rank`` columns."""
    if manifest.engine == "onnxruntime-genai":
        from kiln_runtimes.backends.genai import GenAIGenerationBackend

        return GenAIGenerationBackend(
            threads=threads, cpus=cpus, adapter_slots=adapter_slots, adapter_rank=adapter_rank
        )
    raise ValueError(f"no generation backend for engine {manifest.engine!r}")


def get_tensor_backend(manifest: ModelManifest) -> TensorBackend:
    """Return the tensor backend for a manifest's engine."""
    if manifest.engine in ("onnxruntime", "tensorrt"):
        from kiln_runtimes.backends.onnx_tensor import OnnxTensorBackend

        return OnnxTensorBackend()
    raise ValueError(f"no tensor backend for engine {manifest.engine!r}")
