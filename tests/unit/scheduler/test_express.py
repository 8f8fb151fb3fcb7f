"""The express lane: spare credits per worker for light tenants (no normal credit held, a short
queue) whose next request leads the others in fair order by at most ``express_depth`` requests."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest

from kiln_platform.scheduler.core import PoolScheduler, SchedulerConfig
from kiln_platform.scheduler.policy import PolicyConfig, PoolQueue
from kiln_platform.scheduler.schemas import Credit, Priority

if TYPE_CHECKING:
    from tests.unit.scheduler.conftest import MakeRequest


def full(*workers: str) -> list[Credit]:
    """Workers with every normal credit in use and one express credit free."""
    return [Credit(w, 0, express=1) for w in workers]


def test_an_idle_tenant_gets_the_express_credit_of_a_full_worker(make_request: MakeRequest) -> None:
    queue = PoolQueue()
    for _ in range(3):
        queue.push(make_request("a"))
    b = make_request("b")
    queue.push(b)
    sent, _ = queue.next_dispatch(0.0, full("w"), busy={"a"})
    assert [(d.request, d.worker, d.express) for d in sent] == [(b, "w", True)]
    assert len(queue) == 3


def test_a_tenant_with_requests_in_flight_gets_no_express_credit(make_request: MakeRequest) -> None:
    queue = PoolQueue()
    queue.push(make_request("a"))
    assert queue.next_dispatch(0.0, full("w0", "w1"), busy={"a"}) == ([], [])
    assert len(queue) == 1  # the spare credit stays unused


def test_a_light_tenant_takes_the_lane_even_with_normal_credits_free(
    make_request: MakeRequest,
) -> None:
    queue = PoolQueue()
    a, b = make_request("a"), make_request("b")
    queue.push(a)
    queue.push(b)
    sent, _ = queue.next_dispatch(0.0, [Credit("w", 2, express=1)], busy={"a"})
    assert [(d.request, d.express) for d in sent] == [(b, True), (a, False)]


def test_express_credits_are_counted_per_worker(make_request: MakeRequest) -> None:
    queue = PoolQueue()
    for tenant in "bcde":
        queue.push(make_request(tenant))
    sent, _ = queue.next_dispatch(0.0, [Credit("w0", 0, express=2), Credit("w1", 0, express=1)])
    assert [(d.request.tenant, d.worker) for d in sent] == [("b", "w0"), ("c", "w0"), ("d", "w1")]
    assert all(d.express for d in sent)
    assert queue.next_dispatch(0.0, []) == ([], [])  # no express credit left: e waits


def test_fair_order_decides_among_eligible_tenants(make_request: MakeRequest) -> None:
    queue = PoolQueue()
    queue.push(make_request("b"))
    queue.next_dispatch(0.0, [Credit("w", 1)])  # b was served last: c's start tag is smaller
    queue.push(make_request("b"))
    queue.push(make_request("c"))
    (d,), _ = queue.next_dispatch(0.0, full("w"))
    assert d.request.tenant == "c"


def test_an_express_request_that_cannot_finish_expires(make_request: MakeRequest) -> None:
    queue = PoolQueue()
    late, ok = make_request("b", deadline=0.5), make_request("c")
    queue.push(late)
    queue.push(ok)
    sent, expired = queue.next_dispatch(1.0, full("w"))
    assert expired == [late]
    assert [d.request for d in sent] == [ok]


def test_express_off_leaves_the_spare_credit_alone(make_request: MakeRequest) -> None:
    queue = PoolQueue(PolicyConfig(express=False))
    queue.push(make_request("b"))
    assert queue.next_dispatch(0.0, full("w")) == ([], [])


def test_the_scheduler_knows_which_tenants_hold_normal_credits(make_request: MakeRequest) -> None:
    sched = PoolScheduler(slots=1)  # express_depth 3: a light tenant leads by 3 requests at most
    a1, a2, a3, a4 = (make_request("a") for _ in range(4))
    b1, b2, b3, b4, b5, b6 = (make_request("b") for _ in range(6))
    for r in (a1, a2, a3, a4, b1):
        sched.submit(r, 0.0)
    sent, _ = sched.dispatch(0.0, [Credit("w", 1, express=1)])  # a is backlogged: 4 queued
    assert [(d.request, d.express) for d in sent] == [(b1, True), (a1, False)]
    for r in (b2, b3, b4):
        sched.submit(r, 0.0)
    # b holds no normal credit: b2..b4 start at 1..3, within 3 requests of a2 (start 1)
    sent, _ = sched.dispatch(0.0, [Credit("w2", 0, express=3)])
    assert [(d.request, d.express) for d in sent] == [(b2, True), (b3, True), (b4, True)]
    assert sched.in_flight == 5  # a1 on the slot, b1..b4 on the lane
    sched.submit(b5, 0.0)
    sched.submit(b6, 0.0)
    (d,), _ = sched.dispatch(0.0, [Credit("w3", 0, express=3)])
    assert d.request is b5  # b6 (start 5) would lead a2 (1) by four requests
    sched.complete(a1.id, 0.2)
    (d,), _ = sched.dispatch(0.2, [Credit("w", 1)])
    assert (d.request, d.express) == (a2, False)
    (d,), _ = sched.dispatch(0.2, full("w4"))
    assert (d.request, d.express) == (b6, True)  # a3 is next at 2: b6 is three ahead again


def test_a_tenant_served_ahead_of_its_share_waits_for_its_turn(make_request: MakeRequest) -> None:
    queue = PoolQueue()
    for tenant in "aba":
        queue.push(make_request(tenant, 4.0))
    queue.next_dispatch(0.0, [Credit("w", 3)])  # a at 0 and 4, b at 0: a's next starts at 8
    queue.push(make_request("a"))
    queue.push(make_request("b"))  # b starts at 4: ahead of a in fair order
    (d,), _ = queue.next_dispatch(0.0, [Credit("w", 0, express=1)])
    assert (d.request.tenant, d.express) == ("b", True)
    queue.push(make_request("b"))  # b at 5, still before a's 8
    queue.push(make_request("c"))  # a newcomer starts at v = 4
    sent, _ = queue.next_dispatch(0.0, [Credit("w", 0, express=2)])
    assert [d.request.tenant for d in sent] == ["c", "b"]
    assert queue.next_dispatch(0.0, full("w"), busy={"a"}) == ([], [])  # a holds credits


def test_a_tenant_served_alone_on_the_lane_is_not_held_back_later(
    make_request: MakeRequest,
) -> None:
    queue = PoolQueue()
    for _ in range(100):  # alone on the pool: every request goes express, in turn
        queue.push(make_request("b"))
        (d,), _ = queue.next_dispatch(0.0, full("w"))
        assert d.express
    for _ in range(5):
        queue.push(make_request("a"))
    queue.next_dispatch(0.0, [Credit("w", 1)])  # a flood arrives and takes the slot
    queue.push(make_request("b"))
    (d,), _ = queue.next_dispatch(0.0, full("w"), busy={"a"})
    assert (d.request.tenant, d.express) == ("b", True)  # v followed b: no debt from its past


def test_a_backlogged_tenant_never_takes_the_lane(make_request: MakeRequest) -> None:
    queue = PoolQueue(PolicyConfig(express_depth=2))  # (3 by default)
    for _ in range(3):
        queue.push(make_request("a"))
    assert queue.next_dispatch(0.0, full("w")) == ([], [])
    queue.push(make_request("b"))
    (d,), _ = queue.next_dispatch(0.0, full("w"))
    assert d.request.tenant == "b"


def _saturate(
    make_request: MakeRequest, *, express: bool, workers: int, slots: int
) -> tuple[list[str], int]:
    """Two backlogged tenants (weights 3 and 1) on ``workers`` x ``slots``; every worker
    advertises two express credits. Returns the order served and the express count."""
    config = SchedulerConfig(policy=PolicyConfig(express=express))
    sched = PoolScheduler(config, slots=workers * slots)
    running: dict[str, list[_Running]] = {f"w{i}": [] for i in range(workers)}
    order: list[str] = []
    used = 0
    for step in range(400):
        for tenant, weight in (("a", 3.0), ("b", 1.0)):
            while sched.queue.backlog(step).tenant_count(tenant) < 8:
                sched.submit(make_request(tenant, weight=weight, at=step), step)
        for run in running.values():  # the oldest finishes; all of them every third step
            for r in run[: len(run) if step % 3 == 0 else 1]:
                sched.complete(r.id, step)
                run.remove(r)
        free = {w: slots - sum(not r.express for r in run) for w, run in running.items()}
        spare = {w: 2 - sum(r.express for r in run) for w, run in running.items()}
        sent, _ = sched.dispatch(step, [Credit(w, free[w], spare[w]) for w in running])
        for d in sent:
            used += d.express
            running[d.worker].append(_Running(d.request.id, d.express))
            order.append(d.request.tenant)
    return order, used


@dataclass(frozen=True, slots=True)
class _Running:
    id: str
    express: bool


@pytest.mark.parametrize(("workers", "slots"), [(2, 4), (1, 2)])
def test_two_saturating_tenants_keep_their_shares(
    make_request: MakeRequest, workers: int, slots: int
) -> None:
    with_express, used = _saturate(make_request, express=True, workers=workers, slots=slots)
    without, _ = _saturate(make_request, express=False, workers=workers, slots=slots)
    assert used == 0  # backlogged: neither ever qualifies
    assert with_express == without
    assert Counter(with_express)["a"] / len(with_express) == pytest.approx(0.75, abs=0.01)


def test_a_batch_priority_tenant_is_never_sent_express(make_request: MakeRequest) -> None:
    queue = PoolQueue()
    job = make_request("jobs", priority=Priority.BATCH)
    queue.push(job)
    assert queue.next_dispatch(0.0, full("w"), busy=set()) == ([], [])
    assert len(queue) == 1  # the spare credit is for interactive work alone
    sent, _ = queue.next_dispatch(0.0, [Credit("w", 1, express=1)], busy=set())
    assert [(d.request, d.express) for d in sent] == [(job, False)]
