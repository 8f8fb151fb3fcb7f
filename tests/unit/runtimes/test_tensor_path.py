"""The worker's tensor path: request validation, shape buckets, and the batcher with tensor rows."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import numpy as np
import pytest

from kiln_runtimes import _tensor
from kiln_runtimes._batch_types import Batch, Outcome
from kiln_runtimes._errors import BadRequest, DeadlineExceeded, Internal
from kiln_runtimes._latency import LatencyModel
from kiln_runtimes.backends.base import EngineOptions
from kiln_runtimes.backends.onnx_tensor import OnnxTensorBackend
from kiln_runtimes.batch_queue import BatchPolicy, BatchQueue
from kiln_runtimes.batcher import Batcher
from kiln_runtimes.protocol import InferRequest, ModelManifest, Tensor, TensorSpec

SEQ = ModelManifest(
    name="seq", task="tensor", engine="onnxruntime", tokenizer_file=None, batching=True,
    inputs=[TensorSpec(name="tokens", datatype="FP32", shape=[-1, -1])],
    outputs=[TensorSpec(name="mean", datatype="FP32", shape=[-1, 1])],
)  # fmt: skip


def tensor(name: str, array: np.ndarray, datatype: str = "FP32") -> Tensor:
    return Tensor(name=name, datatype=datatype, shape=list(array.shape), data=array.tobytes())


def mlp_request(n: int, **changes: Tensor) -> InferRequest:
    inputs = {
        "x": tensor("x", np.ones((n, 16), np.float32)),
        "scale": tensor("scale", np.ones((n, 1), np.float32)),
    }
    inputs.update(changes)
    return InferRequest(request_id="r", inputs=list(inputs.values()))


def test_decode_splits_a_request_into_one_row_per_batch_item(mlp_manifest: ModelManifest) -> None:
    rows = _tensor.decode(mlp_request(3), mlp_manifest, max_rows=64)
    assert len(rows) == 3
    assert rows[0]["x"].shape == (1, 16)
    assert rows[2]["scale"].shape == (1, 1)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"x": tensor("x", np.ones((3, 8), np.float32))}, "shape"),
        ({"x": tensor("x", np.ones((3, 16), np.float64), "FP64")}, "must be FP32"),
        ({"scale": tensor("scale", np.ones((2, 1), np.float32))}, "batch dimension"),
        ({"extra": tensor("extra", np.ones((3, 1), np.float32))}, "exactly"),
        ({"x": Tensor(name="x", datatype="FP32", shape=[3, 16], data=b"\0" * 12)}, "bytes"),
    ],
)
def test_decode_rejects_what_the_model_cannot_take(
    change: dict[str, Tensor], message: str, mlp_manifest: ModelManifest
) -> None:
    with pytest.raises(BadRequest, match=message):
        _tensor.decode(mlp_request(3, **change), mlp_manifest, max_rows=64)


def test_decode_bounds_the_rows_of_one_request(mlp_manifest: ModelManifest) -> None:
    with pytest.raises(BadRequest, match="between 1 and 2"):
        _tensor.decode(mlp_request(3), mlp_manifest, max_rows=2)


def test_variable_length_rows_run_in_shape_buckets(tensor_models: dict[str, Path]) -> None:
    backend = OnnxTensorBackend(EngineOptions(threads=1, max_batch_size=4))
    model = tensor_models["seq"]
    backend.load(model.parent, msgspec.structs.replace(SEQ, model_file=model.name))
    backend.warmup()
    lengths = [3, 5, 3, 7, 5]
    rows = [{"tokens": np.full((1, n), float(n), np.float32)} for n in lengths]
    results = backend.run(rows)
    assert [float(r["mean"][0]) for r in results] == [float(n) for n in lengths]


def test_batcher_settles_tensor_rows_and_rejects_a_short_result() -> None:
    clock = [0.0]
    queue = BatchQueue(BatchPolicy(4, 0.01, 64), lambda: clock[0], LatencyModel(0.01, 0.02))
    ticket = queue.submit("r", [{"x": 1}, {"x": 2}], None)
    batch, _ = queue.poll()
    assert batch is None
    clock[0] = 0.02
    batch, _ = queue.poll()
    assert isinstance(batch, Batch)
    results = [{"y": np.array([i])} for i in (1, 2)]
    assert queue.finish(batch, [Outcome(batch, results, 0.01)]) == [ticket]
    assert [r["y"][0] for r in ticket.rows] == [1, 2]

    other = queue.submit("s", [{"x": 1}, {"x": 2}], None)
    clock[0] = 1.0
    batch, _ = queue.poll()
    assert batch is not None
    assert queue.finish(batch, [Outcome(batch, results[:1], 0.01)]) == [other]
    assert isinstance(other.error, Internal)


async def test_tensor_request_expires_while_queued_behind_a_long_batch() -> None:
    """A tight deadline fails while waiting, before the running batch ends (not after)."""
    release = asyncio.Event()
    loop = asyncio.get_running_loop()

    def run(rows: list[dict[str, np.ndarray]], stop: object = None) -> list[dict[str, np.ndarray]]:
        asyncio.run_coroutine_threadsafe(release.wait(), loop).result()
        return [{"y": r["x"]} for r in rows]

    batcher = Batcher(run, BatchPolicy(1, 0.0, 64), model=LatencyModel(0.001, 0.001))
    batcher.start()
    try:
        first = asyncio.create_task(batcher.submit("long", [{"x": np.zeros(1)}], None))
        await asyncio.sleep(0.05)
        with pytest.raises(DeadlineExceeded):
            await asyncio.wait_for(batcher.submit("tight", [{"x": np.zeros(1)}], 0.05), 1.0)
        assert not first.done()  # it expired while the long batch was still running
        release.set()
        await first
    finally:
        release.set()
        await batcher.close()
