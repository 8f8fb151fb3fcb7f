"""The adaptive batch wait: a partial batch waits for company only when some is coming and pays."""

from __future__ import annotations

import pytest

from kiln_runtimes._arrivals import ArrivalRate, worth_waiting
from kiln_runtimes._latency import LatencyModel
from kiln_runtimes.batch_queue import BatchPolicy, BatchQueue

pytestmark = pytest.mark.unit

CPU = LatencyModel(a=0.0017, b=0.0012)
"""all-MiniLM-L6-v2 on 2 cores: ~1.7 ms a sentence, ~1.2 ms a session run."""
GPU = LatencyModel(a=0.0001, b=0.004)
"""A batch costs about one item's time: waiting for company pays."""


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_arrival_rate_smooths_gaps_and_sees_a_drop_at_once() -> None:
    rate = ArrivalRate(weight=0.5)
    assert rate.expected_gap(0.0) is None
    rate.observe(0.0)
    assert rate.expected_gap(0.0) is None
    rate.observe(0.002)
    rate.observe(0.006)
    assert rate.expected_gap(0.006) == pytest.approx(0.003)  # 0.002 + 0.5 * (0.004 - 0.002)
    assert rate.expected_gap(0.050) == pytest.approx(0.044)  # quiet since: no longer 3 ms


@pytest.mark.parametrize(
    ("model", "size", "waited", "gap", "wait"),
    [
        (GPU, 1, 0.0, None, True),  # nothing known: wait as before
        (GPU, 1, 0.0, 0.001, True),  # the newcomer saves 3 ms, the one waiting loses 1.1 ms
        (GPU, 1, 0.0, 0.006, False),  # expected after the 5 ms budget
        (GPU, 1, 0.004, 0.002, False),  # within the gap but not within what is left of it
        (GPU, 3, 0.0, 0.001, False),  # three waiting lose more than the newcomer saves
        (CPU, 1, 0.0, 0.0001, False),  # on a CPU a batch costs its items: never worth it
    ],
)
def test_worth_waiting(
    model: LatencyModel, size: int, waited: float, gap: float | None, wait: bool
) -> None:
    assert worth_waiting(model, size=size, waited=waited, budget=0.005, gap=gap) is wait


def _queue(model: LatencyModel, clock: Clock, *, adaptive: bool = True) -> BatchQueue:
    policy = BatchPolicy(max_batch_size=32, max_wait=0.005, adaptive=adaptive)
    return BatchQueue(policy, clock, LatencyModel(model.a, model.b))


def _after_one_request(queue: BatchQueue, clock: Clock) -> None:
    """One request run; the clock at 20 ms after it arrived (a closed loop at concurrency 1)."""
    queue.submit("warm", [[1]], None)
    batch, _ = queue.poll()
    clock.now = 0.005
    batch, _ = queue.poll()
    assert batch is not None
    queue.finish(batch, [])
    clock.now = 0.020


def test_a_lone_request_runs_at_once_when_no_company_is_expected() -> None:
    clock = Clock()
    queue = _queue(GPU, clock)
    _after_one_request(queue, clock)
    queue.submit("alone", [[1, 2]], None)
    batch, _ = queue.poll()
    assert batch is not None
    assert batch.reason == "alone"
    assert batch.started_at == clock.now  # no wait at all


def test_with_a_fixed_wait_the_lone_request_waits_max_wait() -> None:
    clock = Clock()
    queue = _queue(GPU, clock, adaptive=False)
    _after_one_request(queue, clock)
    queue.submit("alone", [[1, 2]], None)
    assert queue.poll()[0] is None
    clock.now += 0.005
    batch, _ = queue.poll()
    assert batch is not None
    assert batch.reason == "wait"


def test_when_company_is_coming_and_pays_the_batch_waits_for_it() -> None:
    clock = Clock()
    queue = _queue(GPU, clock)
    queue.submit("r0", [[1]], None)
    assert queue.poll()[0] is None  # nothing known yet: waits
    clock.now = 0.001
    queue.submit("r1", [[1]], None)
    assert queue.poll()[0] is None  # the next is 1 ms away and saves 3 ms: waits
    clock.now = 0.002
    queue.submit("r2", [[1]], None)
    batch, _ = queue.poll()  # three would lose 3.3 ms for the fourth's 3 ms: closes
    assert batch is not None
    assert (batch.reason, len(batch.items)) == ("alone", 3)


def test_on_a_cpu_a_partial_batch_does_not_wait_even_at_a_high_rate() -> None:
    clock = Clock()
    queue = _queue(CPU, clock)
    queue.submit("r0", [[1]], None)
    clock.now = 0.0005
    queue.submit("r1", [[1]], None)
    batch, _ = queue.poll()
    assert batch is not None
    assert batch.reason == "alone"
    assert len(batch.items) == 2
