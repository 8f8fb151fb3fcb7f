"""Express batches on a runner of their own: they start beside a normal batch that may not be
stopped, and no normal batch starts while one runs."""

from __future__ import annotations

import asyncio
import threading

import numpy as np

from kiln_runtimes._batch_types import Batch, Outcome, Rows
from kiln_runtimes._latency import LatencyModel
from kiln_runtimes.batch_queue import BatchPolicy, BatchQueue
from kiln_runtimes.batcher import Batcher


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _queue(clock: Clock) -> BatchQueue:
    """One normal runner, batches of 4 predicted at 10 ms an item + 20 ms."""
    return BatchQueue(BatchPolicy(4, 0.0, 64), clock, LatencyModel(0.010, 0.020))


def _rows(batch: Batch) -> Rows:
    return np.array([[ids[0]] for ids in batch.inputs], dtype=np.float32)


def _finish(queue: BatchQueue, batch: Batch) -> None:
    queue.finish(batch, [Outcome(batch, _rows(batch), 0.01)])


def _start(queue: BatchQueue) -> Batch:
    batch, _ = queue.poll()
    assert batch is not None
    return batch


def test_an_express_batch_starts_beside_a_batch_past_half_its_run() -> None:
    clock = Clock()
    queue = _queue(clock)
    queue.submit("flood", [[1]] * 4, None)
    _start(queue)
    clock.now = 0.040  # 40 of a predicted 60 ms: past half, not worth stopping
    queue.submit("quiet", [[9]], None, express=True)
    assert queue.preempt() == []
    express = _start(queue)
    assert express.express
    assert [b.express for b in queue.running] == [False, True]


def test_no_normal_batch_starts_while_an_express_batch_runs() -> None:
    clock = Clock()
    queue = _queue(clock)
    queue.submit("quiet", [[9]], None, express=True)
    express = _start(queue)
    queue.submit("flood", [[1]] * 4, None)
    assert queue.poll()[0] is None
    assert queue.next_wakeup() is None  # nothing to decide until the express batch ends
    _finish(queue, express)
    assert not _start(queue).express


def test_a_stopped_batch_waits_for_the_express_batch_it_made_room_for() -> None:
    clock = Clock()
    queue = _queue(clock)
    queue.submit("flood", [[1]] * 4, None)
    victim = _start(queue)
    queue.submit("quiet", [[9]], None, express=True)
    assert queue.preempt() == [victim]
    express = _start(queue)  # at once, while the victim is being stopped
    queue.requeue(victim)
    assert queue.poll()[0] is None
    _finish(queue, express)
    rerun = _start(queue)
    assert [i.preempted for i in rerun.items] == [True] * 4


def test_a_second_express_batch_waits_for_the_first() -> None:
    clock = Clock()
    queue = _queue(clock)
    queue.submit("b", [[9]], None, express=True)
    first = _start(queue)
    queue.submit("c", [[8]], None, express=True)
    assert queue.poll()[0] is None
    _finish(queue, first)
    assert _start(queue).express


def test_prefetch_keeps_express_batches_on_the_shared_runners() -> None:
    assert BatchPolicy(prefetch=True).runners == 1
    assert BatchPolicy().runners == 2
    assert BatchPolicy(express_lane=False).runners == 1


async def test_without_a_stopper_express_still_runs_while_the_flood_batch_does() -> None:
    release, started = threading.Event(), threading.Event()

    def run(inputs: list[list[int]], stop: object = None) -> Rows:
        if inputs[0][0] == 1:
            started.set()
            assert release.wait(5), "never released"
        return np.array([[ids[0]] for ids in inputs], dtype=np.float32)

    batcher = Batcher(run, BatchPolicy(max_batch_size=4, max_wait=0.0))
    batcher.start()
    try:
        flood = asyncio.create_task(batcher.submit("a", [[1]], None))
        assert await asyncio.to_thread(started.wait, 2)
        express = await asyncio.wait_for(batcher.submit("b", [[9]], None, express=True), 2)
        assert express.embeddings()[0, 0] == 9
        assert not flood.done()
        release.set()
        assert (await asyncio.wait_for(flood, 2)).embeddings()[0, 0] == 1
    finally:
        release.set()
        await batcher.close()
