"""Deadlines are checked while requests wait, not only when they are dispatched."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kiln_platform.scheduler.core import PoolScheduler
from kiln_platform.scheduler.policy import PoolQueue
from kiln_platform.scheduler.schemas import Credit, Request

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.unit.scheduler.conftest import MakeRequest, MakeWorkers


def fixed(seconds: float) -> Callable[[float], float]:
    return lambda cost: seconds


def test_expire_returns_requests_that_can_no_longer_finish(make_request: MakeRequest) -> None:
    queue = PoolQueue()
    doomed = make_request("a", deadline=1.0)
    fine = make_request("a", deadline=5.0)
    free = make_request("a")
    for r in (doomed, fine, free):
        queue.push(r, fixed(0.5))
    assert queue.expire(0.4, fixed(0.5)) == []
    assert queue.expire(0.6, fixed(0.5)) == [doomed]  # 0.6 + 0.5 > 1.0
    assert len(queue) == 2
    assert queue.expire(100.0, fixed(0.5)) == [fine]
    assert len(queue) == 1  # no deadline: never expires


def test_next_expiry_is_the_latest_start_of_the_most_urgent(make_request: MakeRequest) -> None:
    queue = PoolQueue()
    assert queue.next_expiry() is None
    queue.push(make_request(deadline=3.0), fixed(1.0))
    queue.push(make_request(deadline=2.0), fixed(0.5))
    assert queue.next_expiry() == 1.5
    queue.expire(1.5, fixed(0.5))
    assert queue.next_expiry() == 2.0


def test_expiry_while_queued_behind_busy_workers(
    make_request: MakeRequest, fake_workers: MakeWorkers
) -> None:
    sched = PoolScheduler(slots=1)
    workers = fake_workers({"w": 1})
    blocker = make_request("a", 1.0, at=0.0)
    waiting = make_request("b", 1.0, at=0.0, deadline=0.5)
    assert sched.submit(blocker, 0.0).admitted
    assert sched.submit(waiting, 0.0).admitted
    dispatched, _ = sched.dispatch(0.0, workers.credits())
    workers.take(dispatched)
    assert [d.request for d in dispatched] == [blocker]
    at = sched.next_expiry()
    assert at is not None
    assert 0.0 < at < 0.5
    assert sched.expire(at) == [waiting]  # the worker is still busy: reject it now, not late
    (tenant_b,) = [t for t in sched.snapshot(at).tenants if t.tenant == "b"]
    assert tenant_b.rejected == {"deadline_expired": 1}


def test_dispatch_drops_requests_that_became_hopeless(make_request: MakeRequest) -> None:
    queue = PoolQueue()
    late = make_request("a", deadline=1.0)
    ok = make_request("b", deadline=10.0)
    queue.push(late, fixed(0.1))
    queue.push(ok, fixed(0.1))
    sent, expired = queue.next_dispatch(0.95, [Credit("w", 2)], fixed(0.1))
    assert [d.request for d in sent] == [ok]
    assert expired == [late]


def test_a_faster_service_keeps_a_request_alive(make_request: MakeRequest) -> None:
    queue = PoolQueue()
    r = make_request(deadline=2.0)
    queue.push(r, fixed(1.5))  # first check due at 0.5
    assert queue.expire(0.5, fixed(0.2)) == []  # the pool got faster meanwhile
    assert queue.next_expiry() == 1.8
    assert queue.expire(1.8, fixed(0.2)) == [r]


def test_dispatched_and_cancelled_requests_never_expire(make_request: MakeRequest) -> None:
    queue = PoolQueue()
    sent, dropped = make_request(deadline=1.0), make_request(deadline=1.0)
    queue.push(sent, fixed(0.1))
    queue.push(dropped, fixed(0.1))
    queue.next_dispatch(0.0, [Credit("w", 1)], fixed(0.1))
    queue.cancel(dropped.id)
    assert queue.next_expiry() is None
    assert queue.expire(5.0, fixed(0.1)) == []


def test_a_bounded_cost_is_held_to_the_deadline_by_what_it_surely_takes() -> None:
    """A generation's cost is prompt + ``max_tokens``, a bound: it may end at its first token.
    Admission and the queue's expiry hold only its ``least`` cost against the deadline (at the
    prior 0.01 s a unit: 8,000 units are 80 s, 200 are 2 s, against a 60 s deadline)."""
    sched = PoolScheduler(slots=1)
    bounded = Request("big", "a", 8000.0, 0.0, 60.0, least=200.0)
    assert sched.submit(bounded, 0.0).admitted
    assert sched.expire(57.0) == []  # 57 + 2 < 60
    assert sched.expire(58.5) == [bounded]  # it could not finish even its least any more
    whole = Request("whole", "a", 8000.0, 0.0, 60.0)
    decision = sched.submit(whole, 0.0)
    assert decision.reason is not None
    assert decision.reason.value == "deadline_too_short"
    hopeless = Request("hopeless", "a", 8000.0, 0.0, 60.0, least=7000.0)
    assert not sched.submit(hopeless, 0.0).admitted
