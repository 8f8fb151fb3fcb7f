"""Tensor models on ONNX Runtime: named inputs batched along dim 0, bucketed by shape.

A batch holds one row per item (``{input name: array [1, ...]}``). Rows whose non-batch shapes
differ (variable-length inputs) run as separate sub-batches, one per shape bucket, so no model
sees padding it was not trained with.
"""

from __future__ import annotations

import functools
import os
from typing import TYPE_CHECKING, Any

import numpy as np
import onnxruntime as ort

from kiln_runtimes._synthetic import synthetic_inputs
from kiln_runtimes.backends._ort import model_path, open_session
from kiln_runtimes.backends.base import EngineHealth, EngineOptions

if TYPE_CHECKING:
    from pathlib import Path

    from kiln_runtimes.protocol import ModelManifest

Row = dict[str, np.ndarray]


class OnnxTensorBackend:
    """One ``InferenceSession`` over an engine (optimized model) or the uploaded model."""

    def __init__(self, options: EngineOptions | None = None) -> None:
        self._options = options or EngineOptions()
        self._session: Any = None
        self._manifest: ModelManifest | None = None
        self._outputs: list[str] = []

    def load(self, model_dir: Path, manifest: ModelManifest) -> None:
        """Open the manifest's model in ``model_dir``; a compiled engine (``optimized``) loads
        with graph optimization off."""
        model = model_path(model_dir, manifest)
        threads = self._options.threads or os.cpu_count() or 1
        self._session = open_session(model, threads, optimize=not self._options.optimized)
        names = {i.name for i in self._session.get_inputs()}
        expected = {s.name for s in manifest.inputs}
        if names != expected:
            raise ValueError(f"engine inputs {sorted(names)} differ from the manifest's")
        self._manifest = manifest
        self._outputs = [s.name for s in manifest.outputs]

    def warmup(self) -> None:
        """Run synthetic inputs (batch 1, the largest batch, 1) through every kernel."""
        manifest = self._require()
        sizes = (1, self._options.max_batch_size, 1) if manifest.batching else (1,)
        for size in sizes:
            feeds = synthetic_inputs(manifest.inputs, size)
            rows = [{k: v[i : i + 1] for k, v in feeds.items()} for i in range(size)]
            if not manifest.batching:
                rows = [feeds]
            if len(self.run(rows)) != len(rows):
                raise ValueError("warmup returned the wrong number of results")

    def health(self) -> EngineHealth:
        """Loaded or not (the batcher counts the work)."""
        return EngineHealth(loaded=self._session is not None)

    def stop_handle(self) -> ort.RunOptions:
        """A handle for one ``run``: setting its ``terminate`` stops the run at its next node."""
        return ort.RunOptions()

    def run(self, rows: list[Row], stop: ort.RunOptions | None = None) -> list[Row]:
        """Run rows (batched by shape bucket); returns each row's outputs, in order."""
        manifest = self._require()
        run = functools.partial(self._session.run, self._outputs, run_options=stop)
        if not manifest.batching:
            return [dict(zip(self._outputs, run(r), strict=True)) for r in rows]
        buckets: dict[tuple[Any, ...], list[int]] = {}
        for i, row in enumerate(rows):
            signature = tuple((k, v.shape[1:], v.dtype.str) for k, v in sorted(row.items()))
            buckets.setdefault(signature, []).append(i)
        results: list[Row] = [{} for _ in rows]
        for members in buckets.values():
            feeds = {
                name: np.concatenate([rows[i][name] for i in members]) for name in rows[members[0]]
            }
            outputs = run(feeds)
            for j, i in enumerate(members):
                results[i] = {
                    name: out[j] for name, out in zip(self._outputs, outputs, strict=True)
                }
        return results

    def unload(self) -> None:
        """Release the session."""
        self._session = None

    def _require(self) -> ModelManifest:
        if self._session is None or self._manifest is None:
            raise RuntimeError("backend is not loaded")
        return self._manifest
