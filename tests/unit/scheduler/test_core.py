"""PoolScheduler end to end with a fake clock and fake workers."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from kiln_platform.scheduler.admission import AdmissionLimits, RejectReason
from kiln_platform.scheduler.core import PoolScheduler, SchedulerConfig
from kiln_platform.scheduler.schemas import Credit
from kiln_platform.scheduler.service import ServiceConfig

if TYPE_CHECKING:
    from tests.unit.scheduler.conftest import FakeWorkers, MakeRequest, MakeWorkers


def run_saturated(
    sched: PoolScheduler,
    workers: FakeWorkers,
    make_request: MakeRequest,
    *,
    tenants: dict[str, float],
    seconds: float,
    service_s: float,
    step: float = 0.01,
) -> float:
    """Every tenant keeps requests queued; workers finish each after ``service_s``."""
    now, started = 0.0, dict[str, float]()
    for _ in range(int(seconds / step)):
        now += step
        for tenant, weight in tenants.items():
            while sched.queue.backlog(now).tenant_count(tenant) < 8:
                sched.submit(make_request(tenant, 1.0, at=now, weight=weight), now)
        for running in workers.running.values():
            for r in [r for r in running if now - started[r.id] >= service_s - 1e-9]:
                running.remove(r)
                sched.complete(r.id, now)
        sent, _ = sched.dispatch(now, [c for c in workers.credits() if c.free > 0])
        workers.take(sent)
        started.update({d.request.id: now for d in sent})
    return now


@pytest.mark.parametrize(("weights", "share_a"), [((1.0, 1.0), 0.5), ((3.0, 1.0), 0.75)])
def test_saturating_tenants_share_by_weight(
    make_request: MakeRequest,
    fake_workers: MakeWorkers,
    weights: tuple[float, float],
    share_a: float,
) -> None:
    sched = PoolScheduler(slots=4)
    workers = fake_workers({"w0": 2, "w1": 2})
    now = run_saturated(
        sched,
        workers,
        make_request,
        tenants=dict(zip("ab", weights, strict=True)),
        seconds=20,
        service_s=0.05,
    )
    a, _ = sched.snapshot(now).tenants
    assert a.share == pytest.approx(share_a, abs=0.05)
    assert sched.snapshot(now).jain > 0.99


def test_it_learns_the_service_rate(make_request: MakeRequest, fake_workers: MakeWorkers) -> None:
    config = SchedulerConfig(service=ServiceConfig(prior_a=1.0, prior_b=0.0))  # a bad prior
    sched = PoolScheduler(config, slots=4)
    workers = fake_workers({"w0": 4})
    run_saturated(sched, workers, make_request, tenants={"a": 1.0}, seconds=20, service_s=0.1)
    assert sched.rate() == pytest.approx(40.0, rel=0.15)  # 4 slots x 1 cost / 0.1 s
    assert sched.service_time(1.0) == pytest.approx(0.1, rel=0.15)


def test_rejections_are_counted_by_reason(make_request: MakeRequest) -> None:
    limits = AdmissionLimits(max_tenant_queue=2)
    sched = PoolScheduler(SchedulerConfig(limits=limits), slots=1)
    decisions = [sched.submit(make_request("a"), 0.0) for _ in range(3)]
    assert [d.admitted for d in decisions] == [True, True, False]
    assert decisions[2].reason is RejectReason.TENANT_QUEUE_FULL
    (a,) = sched.snapshot(0.0).tenants
    assert (a.admitted, a.rejected) == (2, {"tenant_queue_full": 1})


def test_cancel_and_failed_completions(make_request: MakeRequest) -> None:
    sched = PoolScheduler(slots=1)
    kept, dropped = make_request(), make_request()
    sched.submit(kept, 0.0)
    sched.submit(dropped, 0.0)
    assert sched.cancel(dropped.id) == dropped
    sent, _ = sched.dispatch(0.0, [Credit("w", 1)])
    assert [d.request for d in sent] == [kept]
    model = sched.model
    assert sched.complete(kept.id, 1.0, ok=False) == kept
    assert sched.model == model  # a failure teaches nothing about the service time
    assert sched.complete(kept.id, 1.0) is None  # unknown by now
    assert sched.in_flight == 0


def test_actual_cost_is_charged_to_fair_share(make_request: MakeRequest) -> None:
    sched = PoolScheduler(slots=1)
    first = make_request("llm", 1.0)
    sched.submit(first, 0.0)
    sched.dispatch(0.0, [Credit("w", 1)])
    sched.complete(first.id, 0.1, actual_cost=20.0)
    for _ in range(5):
        sched.submit(make_request("chat", 1.0, at=0.1), 0.1)
    sched.submit(make_request("llm", 1.0, at=0.1), 0.1)
    sent, _ = sched.dispatch(0.1, [Credit("w", 6)])
    assert sent[-1].request.tenant == "llm"
