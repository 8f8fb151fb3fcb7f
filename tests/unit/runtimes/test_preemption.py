"""Express requests preempt a running normal batch: the pure decision on a fake clock, the driver
with a backend that honours its stop handle, and ONNX Runtime's own stop."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from types import SimpleNamespace

import msgspec
import numpy as np
import pytest

from kiln_runtimes._batch_types import Batch, Outcome, Rows
from kiln_runtimes._latency import LatencyModel
from kiln_runtimes.backends.base import EngineOptions, Stop
from kiln_runtimes.backends.onnx_tensor import OnnxTensorBackend
from kiln_runtimes.batch_queue import BatchPolicy, BatchQueue
from kiln_runtimes.batcher import Batcher
from kiln_runtimes.protocol import ModelManifest


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make_queue(clock: FakeClock, *, preempt: bool = True, concurrency: int = 1) -> BatchQueue:
    """Batches of up to 4 items, predicted at 10 ms an item + 20 ms (60 ms for 4); express
    batches share the runners (the express runner: test_express_runner.py)."""
    policy = BatchPolicy(4, 0.0, 64, concurrency, preempt, express_lane=False)
    return BatchQueue(policy, clock, LatencyModel(0.010, 0.020))


def rows(batch: Batch) -> Rows:
    return np.array([[ids[0], len(ids)] for ids in batch.inputs], dtype=np.float32)


def start(queue: BatchQueue) -> Batch:
    batch, _ = queue.poll()
    assert batch is not None
    return batch


def test_express_arrival_stops_a_batch_that_has_most_of_its_run_ahead() -> None:
    clock = FakeClock()
    queue = make_queue(clock)
    flood = queue.submit("a", [[1], [2], [3], [4]], None)
    queue.submit("a2", [[5]], None)
    running = start(queue)
    clock.now = 0.010  # 10 ms into a 60 ms batch
    express = queue.submit("b", [[9]], None, express=True)
    assert queue.preempt() == [running]
    assert queue.preempt() == [], "one stop at a time"

    queue.requeue(running)
    assert queue.running == []
    first = start(queue)
    assert [i.ticket for i in first.items] == [express]
    queue.finish(first, [Outcome(first, rows(first), 0.02)])
    again = start(queue)
    assert [i.ticket.request_id for i in again.items] == ["a", "a", "a", "a"]
    assert all(i.preempted for i in again.items)
    assert not again.preemptible
    assert queue.finish(again, [Outcome(again, rows(again), 0.06)]) == [flood]
    np.testing.assert_array_equal(flood.embeddings()[:, 0], [1, 2, 3, 4])


def test_a_batch_past_half_its_predicted_time_runs_to_the_end() -> None:
    clock = FakeClock()
    queue = make_queue(clock)
    queue.submit("a", [[1], [2], [3], [4]], None)
    start(queue)
    clock.now = 0.031  # 31 of 60 ms run: stopping would waste more than it saves
    queue.submit("b", [[9]], None, express=True)
    assert queue.preempt() == []
    clock.now = 0.029
    assert queue.preempt() != []


def test_a_batch_is_stopped_at_most_once() -> None:
    clock = FakeClock()
    queue = make_queue(clock)
    queue.submit("a", [[1], [2]], None)
    first = start(queue)
    queue.submit("b", [[9]], None, express=True)
    assert queue.preempt() == [first]
    queue.requeue(first)
    express = start(queue)
    queue.finish(express, [Outcome(express, rows(express), 0.02)])
    again = start(queue)
    queue.submit("c", [[8]], None, express=True)
    assert queue.preempt() == []
    assert again in queue.running


@pytest.mark.parametrize("case", ["free runner", "switched off", "express running", "no express"])
def test_no_preemption(case: str) -> None:
    clock = FakeClock()
    queue = make_queue(
        clock, preempt=case != "switched off", concurrency=2 if case == "free runner" else 1
    )
    if case == "express running":
        queue.submit("b0", [[7]], None, express=True)
    else:
        queue.submit("a", [[1], [2], [3], [4]], None)
    start(queue)
    queue.submit("b", [[9]], None, express=case != "no express")
    assert queue.preempt() == []


def test_the_longest_remaining_batch_is_stopped_when_every_runner_is_busy() -> None:
    clock = FakeClock()
    queue = make_queue(clock, concurrency=2)
    queue.submit("short", [[1]], None)
    short = start(queue)
    queue.submit("long", [[2], [3], [4], [5]], None)
    clock.now = 0.001
    long = start(queue)
    queue.submit("b", [[9]], None, express=True)
    assert queue.preempt() == [long]
    assert short in queue.running


def test_requeue_drops_items_of_requests_that_settled_meanwhile() -> None:
    clock = FakeClock()
    queue = make_queue(clock)
    doomed = queue.submit("a", [[1], [2], [3], [4], [5]], 0.5)
    running = start(queue)
    queue.submit("b", [[9]], None, express=True)
    assert queue.preempt() == [running]
    clock.now = 0.6  # a's deadline passes while its batch is being stopped
    _, expired = queue.poll()
    assert expired == [doomed]
    queue.requeue(running)
    assert queue.queued == 1  # only b is left
    assert start(queue).items[0].ticket.request_id == "b"


class StoppableBackend:
    """A fake engine: a batch holding token 1 runs until released or stopped."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.starts = threading.Semaphore(0)
        self.stopped = 0

    def stop_handle(self) -> Stop:
        stop: Stop = SimpleNamespace(terminate=False)
        return stop

    def run(self, inputs: list[list[int]], stop: Stop | None = None) -> Rows:
        if any(ids[0] == 1 for ids in inputs):
            self.starts.release()
            while not self.release.wait(0.001):
                if stop is not None and stop.terminate:
                    self.stopped += 1
                    raise RuntimeError("Exiting due to terminate flag being set to true.")
        return np.array([[ids[0], len(ids)] for ids in inputs], dtype=np.float32)

    async def started(self) -> None:
        assert await asyncio.to_thread(self.starts.acquire, True, 2), "the long batch never ran"


async def test_driver_runs_an_express_request_before_the_batch_it_stops() -> None:
    backend, seen = StoppableBackend(), list[Outcome]()
    batcher = Batcher(
        backend.run,
        BatchPolicy(max_batch_size=4, max_wait=0.0, express_lane=False),
        stopper=backend.stop_handle,
        model=LatencyModel(0.5, 1.0),  # predicted long: the flood batch is worth stopping
        on_batch=seen.append,
    )
    batcher.start()
    try:
        flood = asyncio.create_task(batcher.submit("a", [[1], [2]], None))
        await backend.started()
        express = await asyncio.wait_for(batcher.submit("b", [[9]], None, express=True), 2)
        assert express.embeddings()[0, 0] == 9
        assert not flood.done()
        assert backend.stopped == 1

        await backend.started()  # the flood's items run again, and are not stopped twice
        late = asyncio.create_task(batcher.submit("c", [[8]], None, express=True))
        await asyncio.sleep(0.05)
        assert not late.done()
        assert backend.stopped == 1
        backend.release.set()
        done = await asyncio.wait_for(flood, 2)
        assert done.embeddings()[:, 0].tolist() == [1, 2]
        assert (await asyncio.wait_for(late, 2)).embeddings()[0, 0] == 8
    finally:
        backend.release.set()
        await batcher.close()
    preempted = [o for o in seen if o.preempted]
    rerun = next(o for o in seen if not o.preempted and o.batch.tickets() == [done])
    assert len(preempted) == 1
    assert preempted[0].batch.tickets() == [done]
    assert done.compute_s == pytest.approx(rerun.seconds), "stopped work is not charged"


async def test_without_a_stopper_express_waits_for_the_running_batch() -> None:
    backend = StoppableBackend()
    policy = BatchPolicy(max_batch_size=4, max_wait=0.0, express_lane=False)
    batcher = Batcher(backend.run, policy)
    batcher.start()
    try:
        flood = asyncio.create_task(batcher.submit("a", [[1]], None))
        await backend.started()
        express = asyncio.create_task(batcher.submit("b", [[9]], None, express=True))
        await asyncio.sleep(0.05)
        assert not express.done()
        assert backend.stopped == 0
        backend.release.set()
        await asyncio.wait_for(asyncio.gather(flood, express), 2)
    finally:
        backend.release.set()
        await batcher.close()


def test_onnx_runtime_stops_a_run_when_told(
    tensor_models: dict[str, Path], mlp_manifest: ModelManifest
) -> None:
    backend = OnnxTensorBackend(EngineOptions(threads=1))
    model = tensor_models["mlp"]
    backend.load(model.parent, msgspec.structs.replace(mlp_manifest, model_file=model.name))
    row = {"x": np.ones((1, 16), np.float32), "scale": np.ones((1, 1), np.float32)}
    stop = backend.stop_handle()
    stop.terminate = True
    with pytest.raises(Exception, match="terminate"):
        backend.run([row, row], stop)
    fresh = backend.stop_handle()
    assert len(backend.run([row, row], fresh)) == 2
