"""The ONNX Runtime session every ORT backend opens (CPU)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import onnxruntime as ort

if TYPE_CHECKING:
    from pathlib import Path

    from kiln_runtimes.protocol import ModelManifest


def open_session(path: Path, threads: int, *, optimize: bool = True) -> Any:
    """A CPU ``InferenceSession`` on ``threads`` intra-op threads, run sequentially; ``optimize``
    off for an engine the compiler already optimized."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if optimize
        else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    )
    options.enable_cpu_mem_arena = True
    # Spin-waiting intra-op threads take the cores the worker's and gateway's event loops
    # need between and during batches; blocking waits cost ~0.5 ms a run and win overall.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])


def model_path(model_dir: Path, manifest: ModelManifest) -> Path:
    """The model file a manifest names, refused (``ValueError``) if it is outside ``model_dir``."""
    root = model_dir.resolve()
    path = (root / manifest.model_file).resolve()
    if not path.is_relative_to(root):
        raise ValueError(f"model file {manifest.model_file!r} is outside {root}")
    return path
