"""Dispatch by credits: a worker is never sent more than the free slots it advertised."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from kiln_platform.scheduler.core import PoolScheduler
from kiln_platform.scheduler.policy import PoolQueue
from kiln_platform.scheduler.schemas import Credit

if TYPE_CHECKING:
    from tests.unit.scheduler.conftest import MakeRequest, MakeWorkers


def test_credits_are_never_exceeded_under_random_load(
    make_request: MakeRequest, fake_workers: MakeWorkers
) -> None:
    rng = random.Random(7)
    sched = PoolScheduler(slots=7)
    workers = fake_workers({"w0": 1, "w1": 2, "w2": 4})
    now = 0.0
    for _ in range(2000):
        now += rng.expovariate(50)
        for _ in range(rng.randint(0, 3)):
            sched.submit(make_request(rng.choice("abc"), rng.randint(1, 8), at=now), now)
        for r in workers.finish_oldest() if rng.random() < 0.5 else []:
            sched.complete(r.id, now)
        dispatched, _ = sched.dispatch(now, [c for c in workers.credits() if c.free > 0])
        workers.take(dispatched)  # asserts
    assert sched.in_flight == sum(len(run) for run in workers.running.values())


def test_nothing_is_dispatched_without_credits(make_request: MakeRequest) -> None:
    queue = PoolQueue()
    queue.push(make_request())
    assert queue.next_dispatch(0.0, []) == ([], [])
    assert queue.next_dispatch(0.0, [Credit("w", 0)]) == ([], [])
    assert len(queue) == 1


def test_exactly_the_free_credits_are_filled(make_request: MakeRequest) -> None:
    queue = PoolQueue()
    for _ in range(10):
        queue.push(make_request())
    sent, _ = queue.next_dispatch(0.0, [Credit("w0", 3), Credit("w1", 2)])
    assert sorted(d.worker for d in sent) == ["w0", "w0", "w0", "w1", "w1"]
    assert len(queue) == 5


def test_the_least_loaded_worker_goes_first(make_request: MakeRequest) -> None:
    queue = PoolQueue()
    for _ in range(2):
        queue.push(make_request())
    sent, _ = queue.next_dispatch(0.0, [Credit("busy", 1), Credit("idle", 4)])
    assert [d.worker for d in sent] == ["idle", "idle"]


def test_completions_return_credits(make_request: MakeRequest, fake_workers: MakeWorkers) -> None:
    sched = PoolScheduler(slots=1)
    workers = fake_workers({"w": 1})
    first, second = make_request(), make_request()
    sched.submit(first, 0.0)
    sched.submit(second, 0.0)
    sent, _ = sched.dispatch(0.0, workers.credits())
    workers.take(sent)
    assert sched.dispatch(0.1, [c for c in workers.credits() if c.free]) == ([], [])
    for r in workers.finish_all():
        sched.complete(r.id, 0.2)
    sent, _ = sched.dispatch(0.2, workers.credits())
    assert [d.request for d in sent] == [second]
