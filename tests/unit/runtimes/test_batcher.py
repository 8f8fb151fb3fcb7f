"""The dynamic batcher's decisions, driven by a fake clock and made-up backend results."""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
from collections import Counter

import msgspec
import numpy as np
import pytest

from kiln_runtimes._batch_types import Batch, Outcome, Rows, Ticket
from kiln_runtimes._embed import embed
from kiln_runtimes._errors import DeadlineExceeded, Internal, Overloaded
from kiln_runtimes._latency import LatencyModel
from kiln_runtimes.batch_queue import BatchPolicy, BatchQueue, close_reason
from kiln_runtimes.batcher import Batcher
from kiln_runtimes.protocol import EmbedRequest, InferRequest


class FakeClock:
    """Monotonic seconds that move only when a test says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def make_queue(
    clock: FakeClock,
    *,
    max_batch_size: int = 4,
    max_wait: float = 0.010,
    max_queue: int = 64,
    a: float = 0.010,
    b: float = 0.020,
) -> BatchQueue:
    """A queue whose prior latency model predicts ``t(n) = a*n + b`` (10 ms/item + 20 ms), with
    the fixed wait (the adaptive one: test_adaptive_wait.py)."""
    policy = BatchPolicy(max_batch_size, max_wait, max_queue, adaptive=False)
    return BatchQueue(policy, clock, LatencyModel(a, b))


def rows_for(batch: Batch) -> Rows:
    """Fake embeddings that identify their input: ``[first token id, length]``."""
    return np.array([[ids[0], len(ids)] for ids in batch.inputs], dtype=np.float32)


def succeed(queue: BatchQueue, batch: Batch, seconds: float = 0.01) -> list[Ticket]:
    return queue.finish(batch, [Outcome(batch, rows_for(batch), seconds)])


def test_close_reason_is_a_pure_decision() -> None:
    policy, model = BatchPolicy(max_batch_size=4, max_wait=0.01), LatencyModel(0.01, 0.02)

    def decide(size: int, now: float, deadline: float | None = None) -> str | None:
        return close_reason(
            policy, model, now, size=size, oldest_enqueued_at=0.0, tightest_deadline=deadline
        )

    assert decide(1, 0.0) is None
    assert decide(4, 0.0) == "size"
    assert decide(1, 0.01) == "wait"
    assert decide(2, 0.0, deadline=0.041) is None  # slack 41 ms > t(2) = 40 ms
    assert decide(2, 0.0, deadline=0.040) == "deadline"
    assert decide(3, 0.0, deadline=0.041) == "deadline"  # a bigger batch needs more time


def test_empty_queue_decides_nothing() -> None:
    queue = make_queue(FakeClock())
    assert queue.poll() == (None, [])
    assert queue.next_wakeup() is None


def test_closes_at_max_batch_size() -> None:
    clock = FakeClock()
    queue = make_queue(clock, max_batch_size=4, max_wait=1.0)
    for n in range(3):
        queue.submit(f"r{n}", [[n + 1]], None)
        assert queue.poll() == (None, [])
    queue.submit("r3", [[4]], None)
    batch, expired = queue.poll()
    assert batch is not None
    assert batch.reason == "size"
    assert expired == []
    assert batch.inputs == [[1], [2], [3], [4]]
    assert queue.queued == 0
    assert queue.running == [batch]


def test_concurrency_runs_that_many_batches_at_once() -> None:
    clock = FakeClock()
    policy = BatchPolicy(max_batch_size=2, max_wait=1.0, max_queue=64, concurrency=2)
    queue = BatchQueue(policy, clock, LatencyModel(0.010, 0.020))
    tickets = [queue.submit(f"r{n}", [[n]], None) for n in range(6)]
    first, _ = queue.poll()
    second, _ = queue.poll()
    assert first is not None
    assert second is not None
    assert queue.poll() == (None, [])  # both runners busy: the rest waits
    assert queue.running == [first, second]
    assert succeed(queue, second) == tickets[2:4]  # finishing out of order frees a runner
    third, _ = queue.poll()
    assert third is not None
    assert third.inputs == [[4], [5]]
    assert queue.running == [first, third]


async def test_driver_runs_batches_concurrently() -> None:
    both = threading.Barrier(2, timeout=5)

    def meet(inputs: list[list[int]], stop: object = None) -> Rows:
        both.wait()  # returns only once two batches run at the same time
        return echo(inputs)

    batcher = Batcher(meet, BatchPolicy(max_batch_size=1, max_wait=0.0, concurrency=2))
    batcher.start()
    try:
        done = await asyncio.gather(*(batcher.submit(f"r{n}", [[n]], None) for n in range(2)))
    finally:
        await batcher.close()
    assert [t.request_id for t in done] == ["r0", "r1"]


def test_takes_at_most_max_batch_size_in_fifo_order() -> None:
    clock = FakeClock()
    queue = make_queue(clock, max_batch_size=4)
    for n in range(6):
        queue.submit(f"r{n}", [[n]], None)
    first, _ = queue.poll()
    assert first is not None
    assert first.inputs == [[0], [1], [2], [3]]
    assert queue.poll() == (None, [])  # one batch runs at a time
    succeed(queue, first)
    assert queue.poll() == (None, [])  # the two left wait for max_wait
    clock.advance(0.010)
    second, _ = queue.poll()
    assert second is not None
    assert second.inputs == [[4], [5]]
    assert second.reason == "wait"


def test_closes_when_the_oldest_item_waited_max_wait() -> None:
    clock = FakeClock()
    queue = make_queue(clock, max_wait=0.010)
    queue.submit("a", [[1]], None)
    clock.advance(0.006)
    queue.submit("b", [[2]], None)
    assert queue.next_wakeup() == pytest.approx(0.010)
    clock.advance(0.003)
    assert queue.poll() == (None, [])
    clock.advance(0.001)
    batch, _ = queue.poll()
    assert batch is not None
    assert batch.reason == "wait"
    assert batch.inputs == [[1], [2]]


def test_closes_early_when_slack_reaches_the_predicted_batch_time() -> None:
    clock = FakeClock()
    queue = make_queue(clock, max_wait=1.0)  # t(n) = 10 ms * n + 20 ms
    queue.submit("tight", [[1]], 0.100)  # deadline 100 ms
    assert queue.next_wakeup() == pytest.approx(0.070)  # 100 - t(1)
    clock.advance(0.030)
    queue.submit("more", [[2], [3]], None)  # three items: t(3) = 50 ms, so close at 50 ms
    assert queue.next_wakeup() == pytest.approx(0.050)
    clock.advance(0.019)
    assert queue.poll() == (None, [])
    clock.advance(0.001)
    batch, expired = queue.poll()
    assert batch is not None
    assert batch.reason == "deadline"
    assert expired == []
    assert batch.inputs == [[1], [2], [3]]


def test_items_without_deadlines_wait_for_max_wait_only() -> None:
    clock = FakeClock()
    queue = make_queue(clock, max_wait=0.5)
    queue.submit("a", [[1]], None)
    clock.advance(0.499)
    assert queue.poll() == (None, [])
    assert queue.next_wakeup() == pytest.approx(0.5)


def test_latency_model_starts_from_its_prior() -> None:
    model = LatencyModel(a=0.002, b=0.005)
    assert model.predict(1) == pytest.approx(0.007)
    assert model.predict(10) == pytest.approx(0.025)


def test_latency_model_learns_a_and_b() -> None:
    model = LatencyModel(a=0.1, b=0.1)
    for n in (1, 2, 4, 8, 16, 32, 3, 5):
        model.observe(n, 0.003 * n + 0.010)
    assert model.a == pytest.approx(0.003)
    assert model.b == pytest.approx(0.010)
    assert model.predict(20) == pytest.approx(0.070)


def test_latency_model_window_forgets_an_old_regime() -> None:
    model = LatencyModel(window=8)
    for n in range(1, 9):
        model.observe(n, 0.050 * n + 0.1)
    for n in range(1, 9):
        model.observe(n, 0.001 * n + 0.002)
    assert (model.a, model.b) == pytest.approx((0.001, 0.002))


def test_latency_model_with_one_batch_size_keeps_the_slope() -> None:
    model = LatencyModel(a=0.002, b=0.005)
    for _ in range(5):
        model.observe(8, 0.036)
    assert model.a == pytest.approx(0.002)
    assert model.b == pytest.approx(0.020)


def test_latency_model_keeps_coefficients_non_negative() -> None:
    falling = LatencyModel()
    for n, seconds in ((1, 0.03), (2, 0.02), (3, 0.01)):
        falling.observe(n, seconds)
    assert falling.a == 0.0
    assert falling.b == pytest.approx(0.02)
    steep = LatencyModel()
    for n, seconds in ((1, 0.001), (10, 0.1)):
        steep.observe(n, seconds)
    assert steep.b == 0.0
    assert steep.a > 0
    assert steep.predict(1) > 0


def test_queue_learns_from_finished_batches() -> None:
    clock = FakeClock()
    queue = make_queue(clock, max_batch_size=2, a=1.0, b=1.0)
    for seconds, size in ((0.012, 1), (0.014, 2)):
        for n in range(size):
            queue.submit(f"r{n}", [[n]], None)
        clock.advance(0.010)
        batch, _ = queue.poll()
        assert batch is not None
        assert len(batch.items) == size
        succeed(queue, batch, seconds)
    assert queue.model.predict(3) == pytest.approx(0.016)


def test_item_past_saving_is_expired_while_queued() -> None:
    clock = FakeClock()
    queue = make_queue(clock, max_wait=1.0)  # t(1) = 30 ms
    queue.submit("hopeless", [[1]], 0.025)
    batch, expired = queue.poll()
    assert batch is None
    assert [t.request_id for t in expired] == ["hopeless"]
    assert isinstance(expired[0].error, DeadlineExceeded)
    assert queue.queued == 0
    assert queue.next_wakeup() is None


def test_items_expire_while_a_long_batch_runs() -> None:
    clock = FakeClock()
    queue = make_queue(clock, max_batch_size=1)  # every submit closes at once
    long = queue.submit("long", [[1]], None)
    running, _ = queue.poll()
    assert running is not None
    soon = queue.submit("soon", [[2]], 0.100)  # expires once now + 30 ms > 100 ms
    later = queue.submit("later", [[3]], 0.200)
    free = queue.submit("free", [[4]], None)
    assert queue.next_wakeup() == pytest.approx(0.070)  # no close while running: expiry only
    clock.advance(0.070)
    assert queue.poll() == (None, [])
    clock.advance(0.001)
    assert queue.poll() == (None, [soon])
    clock.advance(0.100)
    assert queue.poll() == (None, [later])
    assert isinstance(soon.error, DeadlineExceeded)
    assert isinstance(later.error, DeadlineExceeded)
    assert succeed(queue, running) == [long]
    batch, _ = queue.poll()
    assert batch is not None
    assert batch.items[0].ticket is free


def test_multi_input_request_settles_once_with_rows_in_order() -> None:
    clock = FakeClock()
    queue = make_queue(clock, max_batch_size=2)
    ticket = queue.submit("multi", [[10, 11], [20], [30, 31, 32]], None)
    first, _ = queue.poll()
    assert first is not None
    assert first.inputs == [[10, 11], [20]]
    assert succeed(queue, first) == []
    assert not ticket.settled
    assert ticket.pending == 1
    clock.advance(0.010)
    second, _ = queue.poll()
    assert second is not None
    assert second.inputs == [[30, 31, 32]]
    assert succeed(queue, second) == [ticket]
    assert ticket.error is None
    np.testing.assert_array_equal(ticket.embeddings(), [[10, 2], [20, 1], [30, 3]])
    assert ticket.started_at == 0.0
    assert ticket.finished_at == pytest.approx(0.010)


def test_a_failed_batch_fails_the_whole_request_and_drops_its_queued_inputs() -> None:
    clock = FakeClock()
    queue = make_queue(clock, max_batch_size=2)
    ticket = queue.submit("multi", [[1], [2], [3]], None)
    other = queue.submit("other", [[4]], None)
    first, _ = queue.poll()
    assert first is not None
    settled = queue.finish(first, [Outcome(first, RuntimeError("engine broke"), 0.01)])
    assert settled == [ticket]
    assert isinstance(ticket.error, Internal)
    assert queue.queued == 1
    clock.advance(0.010)
    second, _ = queue.poll()
    assert second is not None
    assert [i.ticket for i in second.items] == [other]


def test_wrongly_shaped_backend_result_is_an_internal_error() -> None:
    clock = FakeClock()
    queue = make_queue(clock, max_batch_size=2)
    ticket = queue.submit("r", [[1], [2]], None)
    batch, _ = queue.poll()
    assert batch is not None
    short = np.zeros((1, 4), dtype=np.float32)
    assert queue.finish(batch, [Outcome(batch, short, 0.01)]) == [ticket]
    assert isinstance(ticket.error, Internal)


def test_request_expired_while_partly_running_settles_only_once() -> None:
    clock = FakeClock()
    queue = make_queue(clock, max_batch_size=2)
    ticket = queue.submit("multi", [[1], [2], [3]], 0.5)
    running, _ = queue.poll()
    assert running is not None
    assert ticket.pending == 3
    clock.advance(0.480)  # the third input can no longer make it
    assert queue.poll() == (None, [ticket])
    assert isinstance(ticket.error, DeadlineExceeded)
    assert queue.queued == 0
    assert succeed(queue, running) == []  # its rows are discarded, not a second answer


def test_queue_bound_rejects_with_overloaded_and_retry_after() -> None:
    clock = FakeClock()
    queue = make_queue(clock, max_batch_size=4, max_queue=5)
    queue.submit("a", [[1], [2], [3]], None)
    with pytest.raises(Overloaded) as refused:
        queue.submit("b", [[4], [5], [6]], None)
    assert refused.value.status == 429
    assert refused.value.retry_after_s == pytest.approx(2 * (0.010 * 4 + 0.020))
    assert queue.queued == 3
    queue.submit("c", [[4], [5]], None)
    assert queue.queued == 5


def test_split_isolates_tickets() -> None:
    clock = FakeClock()
    queue = make_queue(clock, max_batch_size=4)
    a = queue.submit("a", [[1], [2]], None)
    b = queue.submit("b", [[3], [4]], None)
    batch, _ = queue.poll()
    assert batch is not None
    assert batch.tickets() == [a, b]
    assert [part.inputs for part in batch.split()] == [[[1], [2]], [[3], [4]]]


def echo(inputs: list[list[int]], stop: object = None) -> Rows:
    """A backend whose rows are ``[first id, length]``; id -1 makes it fail."""
    if any(-1 in ids for ids in inputs):
        raise ValueError("token -1 is out of range")
    return np.array([[ids[0], len(ids)] for ids in inputs], dtype=np.float32)


async def test_driver_batches_concurrent_requests() -> None:
    sizes: list[int] = []

    def record(outcome: Outcome) -> None:
        sizes.append(len(outcome.batch.items))

    batcher = Batcher(echo, BatchPolicy(max_batch_size=8, max_wait=0.02), on_batch=record)
    batcher.start()
    try:
        tickets = await asyncio.gather(
            *(batcher.submit(f"r{n}", [[n, 0], [n + 100]], None) for n in range(6))
        )
    finally:
        await batcher.close()
    for n, ticket in enumerate(tickets):
        np.testing.assert_array_equal(ticket.embeddings(), [[n, 2], [n + 100, 1]])
    assert sum(sizes) == 12
    assert max(sizes) == 8


async def test_driver_isolates_the_request_that_breaks_a_batch() -> None:
    batcher = Batcher(echo, BatchPolicy(max_batch_size=8, max_wait=0.02))
    batcher.start()
    try:
        good, bad, also_good = await asyncio.gather(
            batcher.submit("good", [[1]], None),
            batcher.submit("bad", [[2], [-1]], None),
            batcher.submit("also-good", [[3]], None),
            return_exceptions=True,
        )
    finally:
        await batcher.close()
    assert isinstance(bad, Internal)
    assert isinstance(good, Ticket)
    assert isinstance(also_good, Ticket)
    np.testing.assert_array_equal(also_good.embeddings(), [[3, 1]])


async def test_driver_expires_a_request_while_a_batch_is_running() -> None:
    release = threading.Event()

    def slow(inputs: list[list[int]], stop: object = None) -> Rows:
        release.wait(timeout=5)
        return echo(inputs)

    batcher = Batcher(
        slow, BatchPolicy(max_batch_size=1, max_wait=0.0), model=LatencyModel(0, 0.01)
    )
    batcher.start()
    try:
        long = asyncio.create_task(batcher.submit("long", [[1]], None))
        await asyncio.sleep(0.01)
        with pytest.raises(DeadlineExceeded):
            await asyncio.wait_for(batcher.submit("short", [[2]], 0.05), timeout=2)
        assert not long.done()
        release.set()
        assert (await long).request_id == "long"
    finally:
        release.set()
        await batcher.close()


async def test_driver_rejects_beyond_the_queue_bound() -> None:
    release = threading.Event()

    def blocked(inputs: list[list[int]], stop: object = None) -> Rows:
        release.wait(timeout=5)
        return echo(inputs)

    batcher = Batcher(blocked, BatchPolicy(max_batch_size=2, max_wait=0.0, max_queue=2))
    batcher.start()
    try:
        running = asyncio.create_task(batcher.submit("running", [[1], [2]], None))
        await asyncio.sleep(0.01)
        queued = asyncio.create_task(batcher.submit("queued", [[3], [4]], None))
        await asyncio.sleep(0)
        with pytest.raises(Overloaded):
            await batcher.submit("refused", [[5]], None)
        release.set()
        assert [t.request_id for t in await asyncio.gather(running, queued)] == [
            "running",
            "queued",
        ]
    finally:
        release.set()
        await batcher.close()


# Express requests (the gateway's express lane): at the head, FIFO among themselves, never mixed.
def test_an_express_request_runs_in_the_next_batch_alone() -> None:
    clock = FakeClock()
    queue = make_queue(clock, max_batch_size=4)
    for n in range(6):
        queue.submit(f"a{n}", [[n]], None)
    running, _ = queue.poll()
    assert running is not None
    assert running.inputs == [[0], [1], [2], [3]]
    queue.submit("b", [[100], [101]], None, express=True)
    queue.submit("a6", [[6]], None)
    succeed(queue, running)
    clock.advance(0.010)
    express, _ = queue.poll()
    assert express is not None
    assert [t.request_id for t in express.tickets()] == ["b"]  # ahead of a4, a5: not with them
    assert express.inputs == [[100], [101]]
    succeed(queue, express)
    normal, _ = queue.poll()
    assert normal is not None
    assert [t.request_id for t in normal.tickets()] == ["a4", "a5", "a6"]


def test_express_requests_keep_their_order_and_share_batches() -> None:
    clock = FakeClock()
    queue = make_queue(clock, max_batch_size=4)
    queue.submit("a0", [[0]], None)
    queue.submit("b0", [[10]], None, express=True)
    queue.submit("a1", [[1]], None)
    queue.submit("b1", [[11], [12]], None, express=True)
    queue.submit("b2", [[13], [14]], None, express=True)
    clock.advance(0.010)
    first, _ = queue.poll()
    assert first is not None
    assert [t.request_id for t in first.tickets()] == ["b0", "b1", "b2"]
    assert first.inputs == [[10], [11], [12], [13]]  # max_batch_size, still only express
    succeed(queue, first)
    second, _ = queue.poll()
    assert second is not None
    assert second.inputs == [[14]]  # the rest of b2; a0 and a1 wait for their own batch
    succeed(queue, second)
    third, _ = queue.poll()
    assert third is not None
    assert third.inputs == [[0], [1]]
    assert all(not t.express for t in third.tickets())


def test_an_express_batch_closes_by_the_same_rules() -> None:
    clock = FakeClock()
    queue = make_queue(clock, max_wait=0.010)
    queue.submit("a", [[1], [2], [3]], None)
    queue.submit("b", [[9]], 0.5, express=True)
    assert queue.poll() == (None, [])  # one express item, young, far from its deadline
    assert queue.next_wakeup() == pytest.approx(0.010)
    clock.advance(0.010)
    batch, _ = queue.poll()
    assert batch is not None
    assert batch.inputs == [[9]]
    assert batch.reason == "wait"


def test_an_expired_express_request_leaves_the_head() -> None:
    clock = FakeClock()
    queue = make_queue(clock, max_wait=0.010)  # t(1) = 30 ms
    queue.submit("b", [[9]], 0.030, express=True)
    queue.submit("a", [[1]], None)
    running, _ = queue.poll()  # deadline rule: b's slack is t(1)
    assert running is not None
    assert running.inputs == [[9]]
    queue.submit("b2", [[8]], 0.001, express=True)
    _, expired = queue.poll()
    assert [t.request_id for t in expired] == ["b2"]
    succeed(queue, running)
    clock.advance(0.010)
    batch, _ = queue.poll()
    assert batch is not None
    assert batch.inputs == [[1]]


def test_messages_without_the_express_field_still_decode() -> None:
    old = msgspec.msgpack.encode({"request_id": "r", "input_ids": [[1]]})
    assert msgspec.msgpack.decode(old, type=EmbedRequest).express is False
    old = msgspec.msgpack.encode({"request_id": "r", "inputs": []})
    assert msgspec.msgpack.decode(old, type=InferRequest).express is False
    new = msgspec.msgpack.encode(EmbedRequest(request_id="r", input_ids=[[1]], express=True))
    assert msgspec.msgpack.decode(new, type=EmbedRequest).express is True


async def test_the_embed_path_passes_the_express_flag_to_the_batcher() -> None:
    express: list[bool] = []

    def record(outcome: Outcome) -> None:
        express.extend(t.express for t in outcome.batch.tickets())

    batcher = Batcher(echo, BatchPolicy(max_batch_size=8, max_wait=0.001), on_batch=record)
    batcher.start()
    try:
        for flag in (True, False):
            await embed(batcher, EmbedRequest(request_id="r", input_ids=[[1, 2]], express=flag))
    finally:
        await batcher.close()
    assert express == [True, False]


@pytest.mark.parametrize("prefetch", [False, True])
def test_deadline_bookkeeping_follows_the_queue_through_every_operation(prefetch: bool) -> None:
    """The per-request count of queued items (what deadline scans read) always matches the
    queue, through submits, express inserts, batches, expiry, preemption and failures; with
    prefetch, never more batches are ahead than runners, nor more started than runners (the
    express runner counted)."""
    rng = random.Random(7)
    clock = FakeClock()
    policy = BatchPolicy(4, 0.01, 64, concurrency=2, prefetch=prefetch)
    queue = BatchQueue(policy, clock, LatencyModel(0.010, 0.020))
    expired_seen = 0
    for step in range(600):
        action = rng.random()
        if action < 0.4:
            with contextlib.suppress(Overloaded):
                size = rng.randint(1, 6)
                budget = rng.choice([None, 0.03, 0.2, 1.0])
                queue.submit(f"r{step}", [[step]] * size, budget, express=rng.random() < 0.2)
        elif action < 0.7:
            batch, expired = queue.poll()
            expired_seen += len(expired)
        elif queue.running and action < 0.9:
            batch = rng.choice(queue.running)
            if rng.random() < 0.1:
                queue.finish(batch, [Outcome(batch, ValueError("boom"), 0.01)])
            else:
                succeed(queue, batch)
        elif queue.running:
            queue.requeue(rng.choice(queue.running))
        clock.advance(rng.choice([0.0, 0.002, 0.02]))
        queued = Counter(item.ticket for item in queue._items)
        assert queue._waiting == queued, f"step {step}"
        assert len(queue._ahead) <= 2, f"step {step}"
        assert len(queue._started()) <= policy.runners, f"step {step}"
        late = queue.next_wakeup()
        deadlines = [t.deadline for t in queued if t.deadline is not None]
        if deadlines and late is not None:
            assert late <= min(deadlines)
    assert expired_seen > 0  # the run did exercise expiry


def prefetching(clock: FakeClock) -> BatchQueue:
    """Batches of 4, one runner, prefetch on; the model predicts 10 ms/item + 20 ms."""
    policy = BatchPolicy(max_batch_size=4, max_wait=0.01, max_queue=64, prefetch=True)
    return BatchQueue(policy, clock, LatencyModel(0.010, 0.020))


def running_and_ahead(clock: FakeClock) -> tuple[BatchQueue, Batch, Batch]:
    """A prefetching queue with r0..r3 running and r4..r7 closed ahead of the busy runner."""
    queue = prefetching(clock)
    for n in range(8):
        queue.submit(f"r{n}", [[n]], None)
    running, _ = queue.poll()
    ahead, _ = queue.poll()
    assert running is not None
    assert ahead is not None
    return queue, running, ahead


def test_prefetch_closes_one_full_batch_ahead_of_a_busy_runner() -> None:
    clock = FakeClock()
    queue = prefetching(clock)
    for n in range(13):
        queue.submit(f"r{n}", [[n]], None)
    running, _ = queue.poll()
    ahead, _ = queue.poll()
    assert running is not None
    assert ahead is not None
    assert ahead.inputs == [[4], [5], [6], [7]]
    assert ahead.reason == "size"
    assert queue.poll()[0] is None, "one prefetched batch per runner"
    succeed(queue, running)  # the runner takes the prefetched batch: still no free runner
    nxt, _ = queue.poll()
    assert nxt is not None
    assert nxt.inputs == [[8], [9], [10], [11]]  # the next one, ahead
    succeed(queue, ahead)
    succeed(queue, nxt)
    clock.advance(0.010)
    last, _ = queue.poll()
    assert last is not None
    assert last.inputs == [[12]]
    assert last.reason == "wait"


def test_prefetch_never_closes_a_partial_batch_ahead() -> None:
    clock = FakeClock()
    queue = prefetching(clock)
    for n in range(7):
        queue.submit(f"r{n}", [[n]], None)
    assert queue.poll()[0] is not None
    clock.advance(1.0)  # waited long past max_wait: it still waits for a free runner
    assert queue.poll()[0] is None
    assert queue.queued == 3


def test_prefetch_keeps_items_queued_whose_deadline_cannot_wait_for_the_runner() -> None:
    clock = FakeClock()
    queue = prefetching(clock)
    for n in range(4):
        queue.submit(f"r{n}", [[n]], None)
    running, _ = queue.poll()  # runs until ~0.060 by the model
    assert running is not None
    # t(4) = 0.060: a deadline at 0.100 cannot wait for 0.060 and then run; one at 0.130 can.
    tight = queue.submit("tight", [[10]], 0.100)
    for n in range(3):
        queue.submit(f"s{n}", [[11 + n]], 1.0)
    assert queue.poll()[0] is None, "the tight request would miss its deadline waiting"
    clock.advance(0.075)  # 0.075 + t(1) = 0.105: past saving
    _, expired = queue.poll()  # and it is expired while queued, as without prefetch
    assert expired == [tight]
    roomy = prefetching(FakeClock())
    for n in range(4):
        roomy.submit(f"r{n}", [[n]], None)
    assert roomy.poll()[0] is not None
    roomy.submit("ok", [[10]], 0.130)
    for n in range(3):
        roomy.submit(f"s{n}", [[11 + n]], 1.0)
    assert roomy.poll()[0] is not None


def test_an_express_request_stops_prefetched_batches_and_runs_next() -> None:
    clock = FakeClock()
    queue, running, ahead = running_and_ahead(clock)
    clock.advance(0.055)  # the running batch is nearly done: it is not worth stopping
    queue.submit("x", [[100]], None, express=True)
    assert queue.preempt() == [ahead]
    succeed(queue, running)  # the runner takes the stopped batch, which returns at once
    assert queue.poll()[0] is None
    queue.requeue(ahead)
    clock.advance(0.010)  # an express batch closes by the same rules
    express, _ = queue.poll()
    assert express is not None
    assert express.inputs == [[100]]
    succeed(queue, express)
    again, _ = queue.poll()
    assert again is not None
    assert again.inputs == [[4], [5], [6], [7]]
    assert not again.preemptible


def test_prefetched_batch_counts_its_time_from_when_its_runner_took_it() -> None:
    clock = FakeClock()
    queue, running, ahead = running_and_ahead(clock)
    clock.advance(0.060)
    succeed(queue, running, 0.060)  # the prefetched batch starts now, not when it was closed
    clock.advance(0.010)
    queue.submit("x", [[100]], None, express=True)
    assert queue.preempt() == [ahead], "10 ms run of 60: worth stopping"


def test_a_prefetched_request_starts_when_its_runner_takes_it() -> None:
    """Its queue time (Server-Timing ``worker-queue``) includes the wait for the runner."""
    clock = FakeClock()
    queue, running, ahead = running_and_ahead(clock)
    assert ahead.tickets()[0].started_at is None
    clock.advance(0.060)
    succeed(queue, running, 0.060)
    assert ahead.tickets()[0].started_at == pytest.approx(0.060)
    assert running.tickets()[0].started_at == 0.0
