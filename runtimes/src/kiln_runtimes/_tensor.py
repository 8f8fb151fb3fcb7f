"""The tensor path: find the engine (cached or compiled now), validate, batch, answer."""

from __future__ import annotations

import asyncio
import math
import os
from typing import TYPE_CHECKING

import msgspec
import numpy as np
import structlog

from kiln_runtimes import tensor_bytes
from kiln_runtimes._errors import BadRequest
from kiln_runtimes._spans import ticket_spans
from kiln_runtimes.compile import compile_engine
from kiln_runtimes.engines import ENGINE_MODEL
from kiln_runtimes.protocol import DATATYPES, InferRequest, InferResult, Tensor
from kiln_runtimes.store import ArtifactStore
from kiln_runtimes.tensor_bytes import BYTES

if TYPE_CHECKING:
    from pathlib import Path

    from kiln_runtimes._metrics import WorkerMetrics
    from kiln_runtimes._settings import WorkerSettings
    from kiln_runtimes.batcher import Batcher
    from kiln_runtimes.protocol import ModelManifest

log = structlog.get_logger(__name__)


async def engine_folder(
    settings: WorkerSettings, manifest: ModelManifest, metrics: WorkerMetrics
) -> tuple[Path, ModelManifest, bool]:
    """The folder and manifest to load, and whether they are a compiled engine: the engine
    cached for this model (compiled now on a miss), or the model itself when its folder is not
    in an artifact store."""
    owner = ArtifactStore.owning(settings.model_dir)
    if owner is None:  # a plain folder: no store to cache an engine in
        metrics.engine_cache.labels("uncached").inc()
        return settings.model_dir, manifest, False
    store, digest = owner
    engine_dir, report = await asyncio.to_thread(
        compile_engine, store, digest, target=settings.target, precision=settings.precision,
        threads=settings.engine_threads(os.cpu_count() or 1), max_batch=settings.max_batch_size,
    )  # fmt: skip
    result = "hit" if report.cache_hit else "miss"
    log.info(
        f"engine cache {result}",
        cache_key=report.cache_key,
        engine=report.engine_digest,
        target=report.target,
        precision=report.precision,
        compile_seconds=None if report.cache_hit else round(report.seconds, 3),
    )
    metrics.engine_cache.labels(result).inc()
    return engine_dir, msgspec.structs.replace(manifest, model_file=ENGINE_MODEL), True


def decode(
    request: InferRequest, manifest: ModelManifest, max_rows: int
) -> list[dict[str, np.ndarray]]:
    """Check tensors against the model's input specs; return one row per batch item."""
    specs = {s.name: s for s in manifest.inputs}
    given = {t.name: t for t in request.inputs}
    if len(given) != len(request.inputs) or set(given) != set(specs):
        raise BadRequest(
            f"inputs must be exactly {sorted(specs)}; got {[t.name for t in request.inputs]}"
        )
    arrays: dict[str, np.ndarray] = {}
    for name, spec in specs.items():
        arrays[name] = _array(given[name], spec.datatype, spec.shape)
    if not manifest.batching:
        return [arrays]
    rows = {a.shape[0] for a in arrays.values()}
    if len(rows) != 1:
        raise BadRequest(f"inputs disagree on the batch dimension: {sorted(rows)}")
    n = rows.pop()
    if not 1 <= n <= max_rows:
        raise BadRequest(f"batch dimension is {n}; must be between 1 and {max_rows}")
    return [{k: v[i : i + 1] for k, v in arrays.items()} for i in range(n)]


def _array(tensor: Tensor, datatype: str, shape: list[int]) -> np.ndarray:
    name = tensor.name
    if tensor.datatype != datatype:
        raise BadRequest(f"input {name!r} must be {datatype}, got {tensor.datatype}")
    if len(tensor.shape) != len(shape) or any(
        want >= 0 and want != got for want, got in zip(shape, tensor.shape, strict=True)
    ):
        raise BadRequest(f"input {name!r} has shape {tensor.shape}; the model takes {shape}")
    if any(d < 0 for d in tensor.shape):
        raise BadRequest(f"input {name!r} has a negative dimension")
    if datatype == BYTES:  # ONNX Runtime takes strings as an object array of str
        try:
            texts = tensor_bytes.unpack(tensor.data, math.prod(tensor.shape))
        except ValueError as exc:
            raise BadRequest(f"input {name!r}: its BYTES data {exc}") from None
        return texts.reshape(tensor.shape)
    dtype = np.dtype(DATATYPES[datatype])
    if len(tensor.data) != math.prod(tensor.shape) * dtype.itemsize:
        raise BadRequest(f"input {name!r}: {len(tensor.data)} bytes do not fill {tensor.shape}")
    return np.frombuffer(tensor.data, dtype=dtype).reshape(tensor.shape)


def _tensor(name: str, datatype: str, array: np.ndarray) -> Tensor:
    """An output on the wire (``BYTES``: its strings, length-prefixed)."""
    if datatype == BYTES:
        data = tensor_bytes.pack(array.reshape(-1))
    else:
        data = np.ascontiguousarray(array, dtype=np.dtype(DATATYPES[datatype])).tobytes()
    return Tensor(name=name, datatype=datatype, shape=list(array.shape), data=data)


async def infer(
    batcher: Batcher, request: InferRequest, manifest: ModelManifest, max_rows: int
) -> InferResult:
    """Run a request's rows through the batcher; outputs are stacked back per request."""
    rows = decode(request, manifest, max_rows)
    wanted = request.outputs or [s.name for s in manifest.outputs]
    known = {s.name: s for s in manifest.outputs}
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise BadRequest(f"unknown outputs {unknown}; the model has {sorted(known)}")
    budget = None if request.timeout_ms is None else request.timeout_ms / 1000
    ticket = await batcher.submit(request.request_id, rows, budget, express=request.express)
    ticket_spans(ticket)
    outputs = []
    for name in wanted:
        parts = [r[name] for r in ticket.rows]
        array = np.stack(parts) if manifest.batching else parts[0]
        outputs.append(_tensor(name, known[name].datatype, array))
    started = ticket.started_at if ticket.started_at is not None else ticket.enqueued_at
    return InferResult(
        request_id=request.request_id,
        outputs=outputs,
        queue_ms=(started - ticket.enqueued_at) * 1000,
        compute_ms=ticket.compute_s * 1000,
    )
