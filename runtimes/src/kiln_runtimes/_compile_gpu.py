"""NVIDIA engines: ONNX Runtime's TensorRT EP (EP-context model) with a CUDA EP fallback.

Everything but ``build`` and ``check_available`` is pure: optimization-profile shapes and provider
options are plain data, unit-tested without a GPU. ``onnxruntime`` is imported only inside those
two, and a missing GPU or library raises ``EngineUnavailable`` that says which.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kiln_runtimes._synthetic import DEFAULT_DYNAMIC_DIM, concrete_shape, synthetic_inputs

if TYPE_CHECKING:
    from kiln_runtimes.protocol import ModelManifest, TensorSpec

TRT = "TensorrtExecutionProvider"
CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"
ENGINE_CACHE_DIR = "trt"
_WORKSPACE_BYTES = 2 << 30
ProviderList = list[tuple[str, dict[str, str]]]


class EngineUnavailable(RuntimeError):
    """The GPU, CUDA or TensorRT this target needs is not present here."""


def _dims(shape: list[int]) -> str:
    return "x".join(map(str, shape))


def profile_shapes(
    specs: list[TensorSpec], max_batch: int, opt_batch: int | None = None
) -> dict[str, str]:
    """TensorRT optimization profile (min/opt/max) over the dynamic batch dim of every input.

    Other dynamic dims run from 1 to ``DEFAULT_DYNAMIC_DIM`` (opt = max).
    """
    opt = opt_batch or max(1, max_batch // 2)
    ranges = {
        "min": (1, 1),
        "opt": (opt, DEFAULT_DYNAMIC_DIM),
        "max": (max_batch, DEFAULT_DYNAMIC_DIM),
    }
    return {
        f"trt_profile_{kind}_shapes": ",".join(
            f"{s.name}:{_dims(concrete_shape(s, batch, dynamic))}" for s in specs
        )
        for kind, (batch, dynamic) in ranges.items()
    }


def tensorrt_options(
    engine_dir: Path, manifest: ModelManifest, precision: str, max_batch: int, device_id: int = 0
) -> dict[str, str]:
    """TensorRT EP options: engine + timing caches in ``engine_dir``, profiles, fp16, EP context."""
    options = {
        "device_id": str(device_id),
        "trt_fp16_enable": "True" if precision == "fp16" else "False",
        "trt_max_workspace_size": str(_WORKSPACE_BYTES),
        "trt_engine_cache_enable": "True",
        "trt_engine_cache_path": str(engine_dir / ENGINE_CACHE_DIR),
        "trt_timing_cache_enable": "True",
        "trt_timing_cache_path": str(engine_dir / ENGINE_CACHE_DIR),
        "trt_dump_ep_context_model": "True",
        "trt_ep_context_file_path": str(engine_dir / "model.onnx"),
        "trt_ep_context_embed_mode": "0",
    }
    if manifest.batching:
        options.update(profile_shapes(manifest.inputs, max_batch))
    return options


def cuda_options(device_id: int = 0) -> dict[str, str]:
    """CUDA EP options for the fallback path."""
    return {
        "device_id": str(device_id),
        "cudnn_conv_algo_search": "EXHAUSTIVE",
        "do_copy_in_default_stream": "True",
    }


def providers(
    target: str,
    *,
    engine_dir: Path,
    manifest: ModelManifest,
    precision: str,
    max_batch: int,
    available: list[str],
) -> ProviderList:
    """The provider chain for ``target``: TensorRT -> CUDA -> CPU, only those installed."""
    chain: ProviderList = []
    if target == "tensorrt" and TRT in available:
        chain.append((TRT, tensorrt_options(engine_dir, manifest, precision, max_batch)))
    if target in ("tensorrt", "cuda") and CUDA in available:
        chain.append((CUDA, cuda_options()))
    chain.append((CPU, {}))
    return chain


def check_available(target: str) -> list[str]:
    """Installed execution providers; ``EngineUnavailable`` if ``target``'s own is missing."""
    try:
        import onnxruntime as ort
    except ImportError as exc:  # pragma: no cover - onnxruntime is a hard dependency of workers
        raise EngineUnavailable("onnxruntime is not installed") from exc
    available = list(ort.get_available_providers())
    needed = TRT if target == "tensorrt" else CUDA
    if needed not in available:
        raise EngineUnavailable(
            f"target {target} needs {needed} (onnxruntime-gpu with CUDA"
            f"{' and TensorRT' if needed == TRT else ''}); this onnxruntime offers {available}"
        )
    return available


def build(
    model: Path, out: Path, manifest: ModelManifest, *, target: str, precision: str, max_batch: int
) -> dict[str, Any]:
    """Build the engine into ``out``: a TensorRT EP-context model + engine, or a CUDA model copy."""
    available = check_available(target)
    import onnxruntime as ort

    out.mkdir(parents=True, exist_ok=True)
    if target == "cuda":
        shutil.copyfile(model, out / "model.onnx")
        return {"notes": "CUDA EP serves the original graph"}
    chain = providers(
        target,
        engine_dir=out,
        manifest=manifest,
        precision=precision,
        max_batch=max_batch,
        available=available,
    )
    session = ort.InferenceSession(
        str(model),
        providers=[name for name, _ in chain],
        provider_options=[opts for _, opts in chain],
    )
    # Build the engine at the optimum shape and the extremes of the profile.
    for batch in sorted({1, max(1, max_batch // 2), max_batch} if manifest.batching else {1}):
        session.run(None, synthetic_inputs(manifest.inputs, batch))
    if not (out / "model.onnx").exists():
        raise EngineUnavailable("TensorRT EP did not write an EP-context model")
    return {"notes": f"TensorRT EP-context engine, profiles up to batch {max_batch}"}
