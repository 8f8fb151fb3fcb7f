"""Sentence embeddings on ONNX Runtime CPU: ``input_ids``, ``attention_mask`` -> ``embeddings``."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import onnxruntime as ort

from kiln_runtimes.backends._ort import model_path, open_session
from kiln_runtimes.backends._padding import partition
from kiln_runtimes.backends.base import EngineHealth, EngineOptions

if TYPE_CHECKING:
    from pathlib import Path

    from kiln_runtimes.protocol import ModelManifest

INPUTS = frozenset({"input_ids", "attention_mask"})
OUTPUT = "embeddings"
PAD_ID = 0
# Warmup checks the output shape and runs every kernel once; it stays small because it is on
# the path of a cold start (scale from zero). A 32 x 128 batch cost 630 ms of it to spare the
# first big batch 55 ms (ONNX Runtime's first run of a new shape is ~10% slower on CPU).
WARMUP_BATCH_SIZES = (1, 2)
WARMUP_LENGTH = 16


class OnnxEmbeddingBackend:
    """One CPU ``InferenceSession``; ``run`` pads each batch to its longest sequence."""

    def __init__(self, options: EngineOptions | None = None) -> None:
        self._options = options or EngineOptions()
        self._session: Any = None
        self._context_length = 0
        self._dimensions: int | None = None

    def load(self, model_dir: Path, manifest: ModelManifest) -> None:
        """Open the model named by the manifest, confined to ``model_dir``."""
        path = model_path(model_dir, manifest)
        threads = self._options.threads or os.cpu_count() or 1
        session = open_session(path, threads)
        inputs = {i.name for i in session.get_inputs()}
        outputs = {o.name for o in session.get_outputs()}
        if inputs != INPUTS or OUTPUT not in outputs:
            raise ValueError(
                f"{path.name} has inputs {sorted(inputs)} and outputs {sorted(outputs)}; "
                f"expected inputs {sorted(INPUTS)} and output {OUTPUT!r}"
            )
        self._session = session
        self._context_length = manifest.context_length
        self._dimensions = manifest.dimensions

    def warmup(self) -> None:
        """Run synthetic batches so the first real request finds kernels and arena ready."""
        length = min(self._context_length, WARMUP_LENGTH)
        for size in WARMUP_BATCH_SIZES:
            shape = self.run([[PAD_ID] * length] * size).shape
            if len(shape) != 2 or shape[0] != size or shape[1] != (self._dimensions or shape[1]):
                raise ValueError(
                    f"model returned embeddings of shape {shape} for {size} inputs "
                    f"(manifest dimensions: {self._dimensions})"
                )

    def health(self) -> EngineHealth:
        """Loaded or not (the batcher counts the work)."""
        return EngineHealth(loaded=self._session is not None)

    def stop_handle(self) -> ort.RunOptions:
        """A handle for one ``run``: setting its ``terminate`` stops the run at its next node."""
        return ort.RunOptions()

    def run(
        self, input_ids: list[list[int]], stop: ort.RunOptions | None = None
    ) -> npt.NDArray[np.float32]:
        """Embed unpadded sequences; returns float32 ``[len(input_ids), dimensions]``."""
        if self._session is None:
            raise RuntimeError("backend is not loaded")
        runs = partition([len(s) for s in input_ids])
        if len(runs) == 1:
            return self._run_padded(input_ids, stop)
        out: npt.NDArray[np.float32] | None = None
        for run in runs:
            rows = self._run_padded([input_ids[i] for i in run], stop)
            if out is None:
                out = np.empty((len(input_ids), rows.shape[1]), dtype=np.float32)
            out[run] = rows
        assert out is not None
        return out

    def _run_padded(
        self, input_ids: list[list[int]], stop: ort.RunOptions | None
    ) -> npt.NDArray[np.float32]:
        """One session run over sequences padded to the longest."""
        longest = max(map(len, input_ids))
        ids = np.full((len(input_ids), longest), PAD_ID, dtype=np.int64)
        mask = np.zeros((len(input_ids), longest), dtype=np.int64)
        for row, sequence in enumerate(input_ids):
            ids[row, : len(sequence)] = sequence
            mask[row, : len(sequence)] = 1
        feeds = {"input_ids": ids, "attention_mask": mask}
        (embeddings,) = self._session.run([OUTPUT], feeds, run_options=stop)
        return np.asarray(embeddings, dtype=np.float32)

    def unload(self) -> None:
        """Release the session."""
        self._session = None
