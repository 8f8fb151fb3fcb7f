"""CPU engines: an ONNX Runtime graph-optimized model, optionally int8 (dynamic quantization)."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnxruntime as ort

from kiln_runtimes._synthetic import synthetic_inputs

if TYPE_CHECKING:
    from kiln_runtimes.protocol import ModelManifest

EXTERNAL_DATA = "model.onnx.data"
_REPORT_BATCH = 8
_TIMING_RUNS = 5


def session(path: Path, threads: int, *, optimize: bool, save_to: Path | None = None) -> Any:
    """A CPU session; ``optimize=False`` loads an already-optimized engine without re-optimizing."""
    options = ort.SessionOptions()
    options.log_severity_level = 3  # the hardware-specific-engine warning is expected here
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if optimize
        else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    )
    if save_to is not None:
        options.optimized_model_filepath = str(save_to)
        # Large initializers go to one external file beside the engine (models over 2 GB).
        options.add_session_config_entry(
            "session.optimized_model_external_initializers_file_name", EXTERNAL_DATA
        )
        options.add_session_config_entry(
            "session.optimized_model_external_initializers_min_size_in_bytes", str(1 << 20)
        )
    return ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])


def build(
    model: Path, out: Path, manifest: ModelManifest, precision: str, threads: int
) -> dict[str, Any]:
    """Write ``out/model.onnx`` (optimized, int8 if asked); returns the accuracy/timing report."""
    out.mkdir(parents=True, exist_ok=True)
    source = model
    with tempfile.TemporaryDirectory(prefix="kiln-quant-") as tmp:
        if precision == "int8":
            from onnxruntime.quantization import QuantType, quantize_dynamic

            source = Path(tmp) / "int8.onnx"
            quantize_dynamic(model, source, weight_type=QuantType.QInt8)
        session(source, threads, optimize=True, save_to=out / "model.onnx")
    return accuracy_report(model, out / "model.onnx", manifest, threads)


def accuracy_report(
    reference: Path, engine: Path, manifest: ModelManifest, threads: int
) -> dict[str, Any]:
    """The engine against the fp32 reference on synthetic inputs: max abs diff, cosine, timing."""
    batch = _REPORT_BATCH if manifest.batching else 1
    feeds = synthetic_inputs(manifest.inputs, batch, seed=1)
    ref_session = session(reference, threads, optimize=True)
    eng_session = session(engine, threads, optimize=False)
    expected, ref_ms = _timed(ref_session, feeds)
    actual, eng_ms = _timed(eng_session, feeds)
    diffs, dots, norms_a, norms_b = [], 0.0, 0.0, 0.0
    for want, got in zip(expected, actual, strict=True):
        if np.asarray(want).dtype == object:  # strings: equal or not (another output is numbers)
            diffs.append(0.0 if np.array_equal(want, got) else float("inf"))
            continue
        w, g = np.asarray(want, np.float64).ravel(), np.asarray(got, np.float64).ravel()
        diffs.append(float(np.max(np.abs(w - g))) if w.size else 0.0)
        dots, norms_a, norms_b = dots + float(w @ g), norms_a + float(w @ w), norms_b + float(g @ g)
    cosine = dots / (np.sqrt(norms_a * norms_b) or 1.0)
    return {
        "max_abs_diff": max(diffs, default=0.0),
        "cosine": float(cosine),
        "reference_ms": ref_ms,
        "engine_ms": eng_ms,
        "notes": f"synthetic batch of {batch}; median of {_TIMING_RUNS} runs each",
    }


def _timed(sess: Any, feeds: dict[str, np.ndarray]) -> tuple[list[Any], float]:
    outputs = sess.run(None, feeds)
    times = []
    for _ in range(_TIMING_RUNS):
        start = time.perf_counter()
        sess.run(None, feeds)
        times.append(time.perf_counter() - start)
    return outputs, float(np.median(times) * 1000)
