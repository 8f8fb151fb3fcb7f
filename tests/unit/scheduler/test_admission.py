"""Admission: reject at once, 429 when the tenant is the problem, 503 when the pool is."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import pytest

from kiln_platform.scheduler.admission import (
    AdmissionLimits,
    Decision,
    RejectReason,
    admit,
    predicted_wait,
)
from kiln_platform.scheduler.policy import PolicyConfig
from kiln_platform.scheduler.schemas import Backlog, Priority, Request, TenantBacklog

if TYPE_CHECKING:
    from tests.unit.scheduler.conftest import MakeRequest

POLICY = PolicyConfig()
LIMITS = AdmissionLimits(max_pool_queue=100, max_tenant_queue=40, headroom=0.8)
RATE = 100.0  # cost per second


def flows(*items: tuple[str, int, float, float]) -> Backlog:
    """``(tenant, count, queued cost, arrival rate)`` per interactive tenant, weight 1."""
    return Backlog(
        tuple(TenantBacklog(t, Priority.INTERACTIVE, 1.0, n, c, r) for t, n, c, r in items)
    )


def decide(request: Request, backlog: Backlog, *, service_s: float = 0.01) -> Decision:
    return admit(
        request, backlog, now=0.0, rate=RATE, service_s=service_s, limits=LIMITS, policy=POLICY
    )


def test_an_empty_pool_admits(make_request: MakeRequest) -> None:
    d = decide(make_request("a", deadline=1.0), Backlog())
    assert d.admitted
    assert d.status == 200
    assert d.predicted_wait_s == 0.0
    assert d.reason is None
    assert d.retry_after_s is None


def test_predicted_wait_is_queued_work_over_the_rate(make_request: MakeRequest) -> None:
    backlog = flows(("a", 10, 50.0, 0.0))
    wait = predicted_wait(backlog, make_request("a"), rate=RATE, policy=POLICY, own=50.0)
    assert wait == pytest.approx(0.5)


def test_a_light_tenant_waits_for_its_share_not_the_whole_queue(make_request: MakeRequest) -> None:
    backlog = flows(("flood", 30, 300.0, 500.0))
    wait = predicted_wait(backlog, make_request("light", 2.0), rate=RATE, policy=POLICY, own=0.0)
    assert wait == pytest.approx(0.1, rel=0.01)  # one round: the flood's next request (10)


def test_the_prediction_does_not_depend_on_the_request_size(make_request: MakeRequest) -> None:
    backlog = flows(("flood", 30, 300.0, 500.0))
    small, large = make_request("a", 1.0), make_request("a", 100.0)
    waits = {predicted_wait(backlog, r, rate=RATE, policy=POLICY, own=40.0) for r in (small, large)}
    assert len(waits) == 1  # else a flood at the limit would only ever get its small requests in


def test_others_arrivals_during_the_wait_count(make_request: MakeRequest) -> None:
    backlog = flows(("a", 5, 50.0, 0.0), ("b", 0, 0.0, 20.0))
    wait = predicted_wait(backlog, make_request("a"), rate=RATE, policy=POLICY, own=50.0)
    assert wait == pytest.approx(50.0 / (RATE - 20.0), rel=0.01)  # b keeps 20 of the 100


def test_weights_shape_the_prediction(make_request: MakeRequest) -> None:
    heavy = Backlog(
        (
            TenantBacklog("a", Priority.INTERACTIVE, 3.0, 10, 100.0, 0.0),
            TenantBacklog("b", Priority.INTERACTIVE, 1.0, 10, 100.0, 0.0),
        )
    )
    a = make_request("a", 0.0001, weight=3.0)
    wait = predicted_wait(heavy, a, rate=RATE, policy=POLICY, own=60.0)
    assert wait == pytest.approx((60.0 + 20.0 + 10.0) / RATE, rel=0.01)  # b: 1/3 of 60, + 1 request


def test_a_tenant_over_its_share_gets_429_while_others_are_admitted(
    make_request: MakeRequest,
) -> None:
    backlog = flows(("a", 30, 150.0, 0.0))  # 1.5 s of work queued by a
    d = decide(make_request("a", deadline=1.0), backlog)
    assert not d.admitted
    assert (d.reason, d.status) == (RejectReason.TENANT_OVER_SHARE, 429)
    assert d.retry_after_s == pytest.approx(1.51 - 0.8 * 0.99, abs=0.02)
    assert decide(make_request("b", deadline=1.0), backlog).admitted


def test_a_pool_everyone_would_wait_too_long_for_gets_503(make_request: MakeRequest) -> None:
    backlog = Backlog(
        tuple(TenantBacklog(t, Priority.INTERACTIVE, 1.0, 10, 100.0, 0.0) for t in "abcdefgh")
    )
    d = decide(make_request("new", 10.0, deadline=0.5), backlog)
    assert (d.reason, d.status) == (RejectReason.POOL_OVERLOADED, 503)
    assert d.retry_after_s is not None
    assert 0.1 <= d.retry_after_s <= 60.0


def test_tenant_queue_bound_gives_429(make_request: MakeRequest) -> None:
    backlog = flows(("a", 40, 40.0, 0.0))
    d = decide(make_request("a"), backlog)  # no deadline: only the bounds apply
    assert (d.reason, d.status) == (RejectReason.TENANT_QUEUE_FULL, 429)
    assert d.retry_after_s == pytest.approx(0.1, abs=0.05)  # one slot frees within 1/40 of 0.4 s
    assert decide(make_request("b"), backlog).admitted


def test_full_pool_queue_is_429_for_the_hog_and_503_for_the_fair(make_request: MakeRequest) -> None:
    backlog = flows(("a", 39, 39.0, 0.0), ("b", 39, 39.0, 0.0), ("c", 22, 22.0, 0.0))
    hog = decide(make_request("a"), backlog)
    fair = decide(make_request("d"), backlog)
    assert (hog.reason, hog.status) == (RejectReason.TENANT_OVER_SHARE, 429)
    assert (fair.reason, fair.status) == (RejectReason.POOL_QUEUE_FULL, 503)
    assert fair.retry_after_s is not None
    assert fair.retry_after_s > 0


def test_a_deadline_shorter_than_the_service_is_504_without_retry(
    make_request: MakeRequest,
) -> None:
    d = decide(make_request("a", deadline=0.05), Backlog(), service_s=0.2)
    assert (d.reason, d.status, d.retry_after_s) == (RejectReason.DEADLINE_TOO_SHORT, 504, None)


def test_retry_after_is_clamped(make_request: MakeRequest) -> None:
    backlog = flows(("a", 30, 1e6, 0.0))
    d = decide(make_request("a", deadline=1.0), backlog)
    assert d.retry_after_s == 60.0
    tiny = flows(("a", 5, 80.5, 0.0))  # just over the line
    d = decide(make_request("a", deadline=1.0), tiny)
    assert d.retry_after_s == 0.1


def test_no_workers_means_an_infinite_wait(make_request: MakeRequest) -> None:
    backlog = flows(("a", 1, 1.0, 0.0))
    r = make_request("b", deadline=1.0)
    assert predicted_wait(backlog, r, rate=0.0, policy=POLICY, own=0.0) == math.inf
    d = admit(r, backlog, now=0.0, rate=0.0, service_s=0.01, limits=LIMITS, policy=POLICY)
    assert (d.reason, d.status) == (RejectReason.POOL_OVERLOADED, 503)


def test_batch_waits_for_interactive_only_up_to_its_share(make_request: MakeRequest) -> None:
    backlog = flows(("chat", 100, 1000.0, 0.0))
    batch = make_request("job", 10.0, priority=Priority.BATCH)
    wait = predicted_wait(backlog, batch, rate=RATE, policy=POLICY, own=0.0)
    assert wait == pytest.approx(10.0 / RATE, rel=0.01)  # one chat request, then its turn
    behind = predicted_wait(backlog, batch, rate=RATE, policy=POLICY, own=10.0)
    assert behind == pytest.approx((10.0 + 90.0 + 10.0) / RATE, rel=0.01)  # 9 chat per batch


@pytest.mark.parametrize(
    ("reason", "status"),
    [
        (RejectReason.TENANT_QUEUE_FULL, 429),
        (RejectReason.TENANT_OVER_SHARE, 429),
        (RejectReason.POOL_QUEUE_FULL, 503),
        (RejectReason.POOL_OVERLOADED, 503),
        (RejectReason.DEADLINE_TOO_SHORT, 504),
        (RejectReason.DEADLINE_EXPIRED, 504),
    ],
)
def test_reasons_map_to_statuses(reason: RejectReason, status: int) -> None:
    assert reason.status == status
