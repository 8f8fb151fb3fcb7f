"""Engine cache keys and the GPU compile path's pure logic (profiles, provider options)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kiln_runtimes import _compile_gpu as gpu
from kiln_runtimes._hardware import cpu_hardware, library_versions
from kiln_runtimes.engines import EngineCache, EngineKey, engine_key, validate_target
from kiln_runtimes.protocol import CompileReport, ModelManifest, TensorSpec
from kiln_runtimes.store import ArtifactStore

DIGEST = "sha256:" + "a" * 64
IMAGE = TensorSpec(name="image", datatype="FP32", shape=[-1, 3, 64, 64])
TOKENS = TensorSpec(name="tokens", datatype="INT64", shape=[-1, -1])


def manifest(*specs: TensorSpec, batching: bool = True) -> ModelManifest:
    return ModelManifest(
        name="m", task="tensor", engine="onnxruntime", inputs=list(specs),
        outputs=[TensorSpec(name="out", datatype="FP32", shape=[-1, 10])], batching=batching,
    )  # fmt: skip


def key(**changes: object) -> EngineKey:
    fields: dict[str, object] = {
        "artifact_digest": DIGEST, "target": "cpu", "precision": "fp32",
        "hardware": "x86_64-avx2", "libraries": (("onnxruntime", "1.32.0"),),
    }  # fmt: skip
    fields.update(changes)
    return EngineKey(**fields)  # type: ignore[arg-type]


def test_engine_key_is_stable_and_depends_on_every_field() -> None:
    assert key().digest == key().digest
    assert key().digest.startswith("sha256:")
    variants = [
        key(artifact_digest="sha256:" + "b" * 64),
        key(target="tensorrt"),
        key(precision="int8"),
        key(hardware="x86_64-avx2-avx512f"),
        key(libraries=(("onnxruntime", "1.33.0"),)),
    ]
    assert len({key().digest, *(v.digest for v in variants)}) == 6


def test_engine_key_on_this_machine_names_onnxruntime() -> None:
    k = engine_key(DIGEST, "cpu", "int8")
    assert k.libraries == library_versions("cpu")
    assert k.libraries[0][0] == "onnxruntime"
    assert k.libraries[0][1] != "absent"
    assert k.hardware.startswith(("x86_64", "aarch64", "arm64"))


def test_cpu_hardware_keeps_the_vector_extensions_kernels_dispatch_on() -> None:
    cpuinfo = "processor: 0\nflags\t\t: fpu sse2 avx2 fma avx512f avx512_vnni\nprocessor: 1\n"
    assert cpu_hardware(cpuinfo, "x86_64") == "x86_64-avx2-avx512f-avx512_vnni"
    assert cpu_hardware("", "aarch64") == "aarch64"


@pytest.mark.parametrize(
    ("target", "precision", "ok"),
    [("cpu", "fp32", True), ("cpu", "int8", True), ("cpu", "fp16", False),
     ("tensorrt", "fp16", True), ("cuda", "int8", False), ("tpu", "fp32", False)],
)  # fmt: skip
def test_validate_target(target: str, precision: str, ok: bool) -> None:
    if ok:
        assert validate_target(target, precision) == (target, precision)
    else:
        with pytest.raises(ValueError, match=r"target|precision"):
            validate_target(target, precision)


def test_cache_records_and_finds_an_engine(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "model.onnx").write_bytes(b"engine")
    engine = store.put_dir(tmp_path / "src")
    cache = EngineCache(store)
    assert cache.lookup(key()) is None
    report = CompileReport(
        cache_key=key().digest, engine_digest=engine, target="cpu", precision="fp32",
        hardware="x86_64-avx2", seconds=1.0,
    )  # fmt: skip
    cache.record(key(), report)
    found = cache.lookup(key())
    assert found is not None
    assert found[0] == store.path(engine)
    assert cache.lookup(key(precision="int8")) is None


def test_profile_shapes_cover_the_dynamic_batch_dim() -> None:
    shapes = gpu.profile_shapes([IMAGE, TOKENS], max_batch=32)
    assert shapes == {
        "trt_profile_min_shapes": "image:1x3x64x64,tokens:1x1",
        "trt_profile_opt_shapes": "image:16x3x64x64,tokens:16x16",
        "trt_profile_max_shapes": "image:32x3x64x64,tokens:32x16",
    }
    assert gpu.profile_shapes([IMAGE], 8, opt_batch=4)["trt_profile_opt_shapes"] == (
        "image:4x3x64x64"
    )


def test_tensorrt_options_cache_engines_and_write_an_ep_context_model(tmp_path: Path) -> None:
    options = gpu.tensorrt_options(tmp_path, manifest(IMAGE), "fp16", 32)
    assert options["trt_fp16_enable"] == "True"
    assert options["trt_engine_cache_enable"] == "True"
    assert options["trt_engine_cache_path"] == str(tmp_path / "trt")
    assert options["trt_dump_ep_context_model"] == "True"
    assert options["trt_ep_context_file_path"] == str(tmp_path / "model.onnx")
    assert options["trt_profile_max_shapes"] == "image:32x3x64x64"
    fixed = gpu.tensorrt_options(tmp_path, manifest(IMAGE, batching=False), "fp32", 32)
    assert fixed["trt_fp16_enable"] == "False"
    assert "trt_profile_max_shapes" not in fixed


def test_provider_chain_falls_back_from_tensorrt_to_cuda_to_cpu(tmp_path: Path) -> None:
    m = manifest(IMAGE)

    def names(target: str, available: list[str]) -> list[str]:
        chain = gpu.providers(
            target, engine_dir=tmp_path, manifest=m, precision="fp16", max_batch=8,
            available=available,
        )  # fmt: skip
        return [name for name, _ in chain]

    everything = [gpu.TRT, gpu.CUDA, gpu.CPU]
    assert names("tensorrt", everything) == everything
    assert names("tensorrt", [gpu.CUDA, gpu.CPU]) == [gpu.CUDA, gpu.CPU]
    assert names("cuda", everything) == [gpu.CUDA, gpu.CPU]
    assert names("cpu", everything) == [gpu.CPU]
    assert gpu.cuda_options(1)["device_id"] == "1"


def test_gpu_targets_say_what_is_missing_here() -> None:
    import onnxruntime as ort

    if gpu.TRT in ort.get_available_providers():
        pytest.skip("this machine has the TensorRT EP")
    with pytest.raises(gpu.EngineUnavailable, match="TensorrtExecutionProvider"):
        gpu.check_available("tensorrt")
