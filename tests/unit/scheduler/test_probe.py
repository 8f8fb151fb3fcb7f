"""After an overload inflated the service-time estimate, an idle pool forgets it instead of
refusing every request as too slow for its deadline (bench/overload.py found the lockout)."""

from __future__ import annotations

from kiln_platform.scheduler.admission import RejectReason
from kiln_platform.scheduler.core import PoolScheduler
from kiln_platform.scheduler.schemas import Credit

from .conftest import MakeRequest


def _run(sched: PoolScheduler, make_request: MakeRequest, at: float, seconds: float) -> None:
    """Admit, dispatch and complete one request (no deadline) taking ``seconds``."""
    request = make_request("a", at=at)
    assert sched.submit(request, at).admitted
    sent, _ = sched.dispatch(at, [Credit("w", 1)])
    assert [d.request.id for d in sent] == [request.id]
    sched.complete(request.id, at + seconds)


def test_an_idle_pool_forgets_an_overloads_estimate(make_request: MakeRequest) -> None:
    sched = PoolScheduler(slots=1)
    t = 0.0
    for _ in range(40):  # an overload: each request took 5 s from dispatch to completion
        _run(sched, make_request, t, 5.0)
        t += 5.0
    assert sched.service_time(1.0) > 2.0
    soon = make_request("a", at=t + 0.5, deadline=t + 2.5)
    refused = sched.submit(soon, t + 0.5)
    assert refused.reason is RejectReason.DEADLINE_TOO_SHORT, "the estimate is still fresh"
    later = t + sched.config.probe_after_s
    probe = make_request("a", at=later, deadline=later + 2.0)
    assert sched.submit(probe, later).admitted, "an idle pool forgets a stale estimate"
    assert sched.service_time(1.0) < 1.0
    sent, expired = sched.dispatch(later, [Credit("w", 1)])
    assert ([d.request.id for d in sent], expired) == ([probe.id], [])
    sched.complete(probe.id, later + 0.05)
    t = later + 0.1
    assert sched.submit(make_request("a", at=t, deadline=t + 2.0), t).admitted
