"""TensorRT and CUDA engines on a real NVIDIA GPU (skipped, with the reason, everywhere else)."""

from __future__ import annotations

from pathlib import Path

import msgspec
import numpy as np
import pytest

from kiln_runtimes.protocol import MANIFEST_NAME, ModelManifest
from kiln_runtimes.store import ArtifactStore


def _missing() -> str | None:
    try:
        import onnxruntime as ort
    except ImportError:
        return "onnxruntime is not installed"
    providers = ort.get_available_providers()
    if "TensorrtExecutionProvider" not in providers:
        return (
            "no NVIDIA GPU with TensorRT here: onnxruntime offers "
            f"{providers} (needs onnxruntime-gpu with CUDA and the tensorrt libraries)"
        )
    return None


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_missing() is not None, reason=str(_missing()))]


@pytest.mark.parametrize("target", ["tensorrt", "cuda"])
def test_gpu_engine_matches_cpu_and_is_cached(
    tensor_models: dict[str, Path], mlp_manifest: ModelManifest, tmp_path: Path, target: str
) -> None:
    import onnxruntime as ort

    from kiln_runtimes import _compile_gpu as gpu
    from kiln_runtimes.compile import compile_engine

    manifest = mlp_manifest
    folder = tmp_path / "mlp"
    folder.mkdir()
    (folder / "model.onnx").write_bytes(tensor_models["mlp"].read_bytes())
    (folder / MANIFEST_NAME).write_bytes(msgspec.json.encode(manifest))
    store = ArtifactStore(tmp_path / "store")
    digest = store.put_dir(folder)
    engine, report = compile_engine(store, digest, target=target, precision="fp32", threads=1)
    assert not report.cache_hit
    _, again = compile_engine(store, digest, target=target, precision="fp32", threads=1)
    assert again.cache_hit
    chain = gpu.providers(
        target, engine_dir=engine, manifest=manifest, precision="fp32", max_batch=32,
        available=ort.get_available_providers(),
    )  # fmt: skip
    session = ort.InferenceSession(
        str(engine / "model.onnx"), providers=[n for n, _ in chain],
        provider_options=[o for _, o in chain],
    )  # fmt: skip
    feeds = {"x": np.ones((4, 16), np.float32), "scale": np.ones((4, 1), np.float32)}
    reference = ort.InferenceSession(str(tensor_models["mlp"]), providers=["CPUExecutionProvider"])
    for got, want in zip(session.run(None, feeds), reference.run(None, feeds), strict=True):
        assert float(np.max(np.abs(got - want))) <= 1e-3
