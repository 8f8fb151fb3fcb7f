"""The express lane: one spare credit per worker for a tenant with nothing in flight."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import pytest

from kiln_platform.scheduler.core import PoolScheduler, SchedulerConfig
from kiln_platform.scheduler.policy import PolicyConfig, PoolQueue
from kiln_platform.scheduler.schemas import Credit


def full(*workers: str) -> list[Credit]:
    """Workers with every normal credit in use and their express credit free."""
    return [Credit(w, 0, express=True) for w in workers]


def test_an_idle_tenant_gets_the_express_credit_of_a_full_worker(make_request) -> None:
    queue = PoolQueue()
    for _ in range(3):
        queue.push(make_request("a"))
    b = make_request("b")
    queue.push(b)
    sent, _ = queue.next_dispatch(0.0, full("w"), busy={"a"})
    assert [(d.request, d.worker, d.express) for d in sent] == [(b, "w", True)]
    assert len(queue) == 3


def test_a_tenant_with_requests_in_flight_gets_no_express_credit(make_request) -> None:
    queue = PoolQueue()
    queue.push(make_request("a"))
    assert queue.next_dispatch(0.0, full("w0", "w1"), busy={"a"}) == ([], [])
    assert len(queue) == 1  # the spare credit stays unused


def test_normal_credits_go_first_in_fair_order(make_request) -> None:
    queue = PoolQueue()
    a, b = make_request("a"), make_request("b")
    queue.push(a)
    queue.push(b)
    sent, _ = queue.next_dispatch(0.0, [Credit("w", 2, express=True)], busy={"a"})
    assert [(d.request, d.express) for d in sent] == [(a, False), (b, False)]


def test_one_express_request_per_worker_and_one_per_tenant(make_request) -> None:
    queue = PoolQueue()
    for tenant in "bbcd":
        queue.push(make_request(tenant))
    sent, _ = queue.next_dispatch(0.0, full("w0", "w1"))
    assert [(d.request.tenant, d.worker) for d in sent] == [("b", "w0"), ("c", "w1")]
    assert all(d.express for d in sent)
    assert queue.next_dispatch(0.0, []) == ([], [])  # no express credit left: d waits


def test_fair_order_decides_among_eligible_tenants(make_request) -> None:
    queue = PoolQueue()
    queue.push(make_request("b"))
    queue.next_dispatch(0.0, [Credit("w", 1)])  # b was served last: c's start tag is smaller
    queue.push(make_request("b"))
    queue.push(make_request("c"))
    (d,), _ = queue.next_dispatch(0.0, full("w"))
    assert d.request.tenant == "c"


def test_an_express_request_that_cannot_finish_expires(make_request) -> None:
    queue = PoolQueue()
    late, ok = make_request("b", deadline=0.5), make_request("c")
    queue.push(late)
    queue.push(ok)
    sent, expired = queue.next_dispatch(1.0, full("w"))
    assert expired == [late]
    assert [d.request for d in sent] == [ok]


def test_express_off_leaves_the_spare_credit_alone(make_request) -> None:
    queue = PoolQueue(PolicyConfig(express=False))
    queue.push(make_request("b"))
    assert queue.next_dispatch(0.0, full("w")) == ([], [])


def test_the_scheduler_knows_which_tenants_are_in_flight(make_request) -> None:
    sched = PoolScheduler(slots=1)
    a1, a2, b1, b2 = (make_request(t) for t in "aabb")
    for r in (a1, a2, b1, b2):
        sched.submit(r, 0.0)
    sent, _ = sched.dispatch(0.0, [Credit("w", 1, express=True)])
    assert [(d.request, d.express) for d in sent] == [(a1, False), (b1, True)]
    assert sched.dispatch(0.0, full("w2")) == ([], [])  # a and b both in flight
    assert sched.tenant_in_flight("b") == 1
    sched.complete(b1.id, 0.1)
    assert sched.tenant_in_flight("b") == 0
    assert sched.dispatch(0.1, full("w2")) == ([], [])  # b was served ahead of a: not yet
    sched.complete(a1.id, 0.2)
    (d,), _ = sched.dispatch(0.2, [Credit("w", 1)])
    assert (d.request, d.express) == (a2, False)  # a's turn: b has caught up with v
    (d,), _ = sched.dispatch(0.2, full("w2"))
    assert (d.request, d.express) == (b2, True)


def test_a_tenant_served_ahead_of_its_share_waits_for_its_turn(make_request) -> None:
    queue = PoolQueue()
    for tenant in "abab":
        queue.push(make_request(tenant, 4.0))
    queue.next_dispatch(0.0, [Credit("w", 2)])  # a and b at v = 0; both finish at 4
    assert queue.next_dispatch(0.0, full("w")) == ([], [])  # idle or not, neither is behind v
    queue.push(make_request("c"))
    (d,), _ = queue.next_dispatch(0.0, full("w"))  # a newcomer starts at v
    assert (d.request.tenant, d.express) == ("c", True)


def _saturate(make_request, *, express: bool, workers: int, slots: int) -> tuple[list[str], int]:
    """Two backlogged tenants (weights 3 and 1) on ``workers`` x ``slots``; every worker
    advertises its express credit. Returns the order served and the express count."""
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
        spare = {w: not any(r.express for r in run) for w, run in running.items()}
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
def test_two_saturating_tenants_keep_their_shares(make_request, workers, slots) -> None:
    with_express, used = _saturate(make_request, express=True, workers=workers, slots=slots)
    without, _ = _saturate(make_request, express=False, workers=workers, slots=slots)
    assert used == 0  # in flight, or served ahead of v: neither ever qualifies
    assert with_express == without
    assert Counter(with_express)["a"] / len(with_express) == pytest.approx(0.75, abs=0.01)
