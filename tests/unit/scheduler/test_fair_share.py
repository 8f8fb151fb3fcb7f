"""Weighted fair share across tenants: shares, cost charging, no starvation, no banked credit."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from kiln_platform.scheduler.policy import PolicyConfig, PoolQueue
from kiln_platform.scheduler.schemas import Credit
from kiln_platform.scheduler.stats import jain_index

if TYPE_CHECKING:
    from collections.abc import Mapping

    from tests.unit.scheduler.conftest import MakeRequest, Saturate

ONE = [Credit("w", 1)]


def share(served: Mapping[str, float], tenant: str) -> float:
    return served[tenant] / sum(served.values())


def test_equal_weights_split_50_50(saturate: Saturate) -> None:
    served = saturate([("a", 1.0, 1.0), ("b", 1.0, 1.0)], 1000)
    assert share(served, "a") == pytest.approx(0.5, abs=0.05)


def test_weights_3_to_1_give_75_percent(saturate: Saturate) -> None:
    served = saturate([("a", 3.0, 1.0), ("b", 1.0, 1.0)], 1000)
    assert share(served, "a") == pytest.approx(0.75, abs=0.05)


def test_shares_are_charged_by_cost_not_by_request(saturate: Saturate) -> None:
    served = saturate([("big", 1.0, 8.0), ("small", 1.0, 1.0)], 2000)
    assert share(served, "big") == pytest.approx(0.5, abs=0.05)


def test_many_tenants_get_their_weighted_share(saturate: Saturate) -> None:
    weights = {"a": 1.0, "b": 2.0, "c": 3.0, "d": 4.0}
    served = saturate([(t, w, 1.0 + i) for i, (t, w) in enumerate(weights.items())], 5000)
    per_weight = [served[t] / w for t, w in weights.items()]
    assert jain_index(per_weight) > 0.999


def test_requests_of_one_tenant_stay_in_order(make_request: MakeRequest) -> None:
    queue = PoolQueue()
    sent = [make_request("a", at=i) for i in range(5)]
    for r in sent:
        queue.push(r)
    got, _ = queue.next_dispatch(0.0, [Credit("w", 5)])
    assert [d.request for d in got] == sent


def test_new_tenant_is_served_within_one_round(make_request: MakeRequest) -> None:
    queue = PoolQueue()
    for _ in range(10_000):
        queue.push(make_request("flood"))
    for _ in range(5_000):  # a long backlog served alone
        queue.next_dispatch(0.0, ONE)
    newcomer = make_request("new")
    queue.push(newcomer)
    first, _ = queue.next_dispatch(0.0, ONE)
    second, _ = queue.next_dispatch(0.0, ONE)
    assert newcomer in [d.request for d in first + second]


def test_idle_tenant_banks_no_credit(make_request: MakeRequest) -> None:
    queue = PoolQueue()
    for _ in range(200):
        queue.push(make_request("busy"))
    for _ in range(100):  # "idle" sends nothing meanwhile
        queue.next_dispatch(0.0, ONE)
    for _ in range(200):
        queue.push(make_request("idle"))
    got, _ = queue.next_dispatch(0.0, [Credit("w", 20)])
    tenants = [d.request.tenant for d in got]
    assert tenants.count("idle") == pytest.approx(10, abs=1)


def test_max_lag_bounds_how_long_past_use_delays_a_tenant(make_request: MakeRequest) -> None:
    queue = PoolQueue(PolicyConfig(max_lag=5.0))
    queue.push(make_request("hog", 1000.0, weight=0.1))  # finish tag 10,000 ahead
    queue.next_dispatch(0.0, ONE)
    for _ in range(100):
        queue.push(make_request("other"))
    queue.push(make_request("hog", 1.0, weight=0.1))
    got, _ = queue.next_dispatch(0.0, [Credit("w", 20)])
    position = [d.request.tenant for d in got].index("hog")
    assert position <= 6  # at most max_lag (5 units of cost at weight 1) served before it


def test_without_max_lag_a_hog_waits_its_debt(make_request: MakeRequest) -> None:
    queue = PoolQueue()
    queue.push(make_request("hog", 1000.0, weight=0.1))
    queue.next_dispatch(0.0, ONE)
    for _ in range(100):
        queue.push(make_request("other"))
    queue.push(make_request("hog", 1.0, weight=0.1))
    got, _ = queue.next_dispatch(0.0, [Credit("w", 50)])
    assert "hog" not in [d.request.tenant for d in got]


def test_adjust_charges_the_actual_cost(make_request: MakeRequest) -> None:
    queue = PoolQueue()
    first = make_request("llm", 1.0)
    queue.push(first)
    queue.next_dispatch(0.0, ONE)
    queue.adjust(first, 10.0)  # it generated far more tokens than estimated
    queue.push(make_request("llm", 1.0))
    for _ in range(12):
        queue.push(make_request("chat", 1.0))
    got, _ = queue.next_dispatch(0.0, [Credit("w", 13)])
    assert [d.request.tenant for d in got].index("llm") >= 9


def test_cancelled_requests_are_not_dispatched(make_request: MakeRequest) -> None:
    queue = PoolQueue()
    keep, drop = make_request("a"), make_request("a")
    queue.push(drop)
    queue.push(keep)
    assert queue.cancel(drop.id) == drop
    assert queue.cancel(drop.id) is None
    got, _ = queue.next_dispatch(0.0, [Credit("w", 2)])
    assert [d.request for d in got] == [keep]
    assert len(queue) == 0


def test_pushing_the_same_request_twice_is_an_error(make_request: MakeRequest) -> None:
    queue = PoolQueue()
    r = make_request()
    queue.push(r)
    with pytest.raises(ValueError, match="already queued"):
        queue.push(r)


def test_backlog_reports_queued_cost_and_arrival_rate(make_request: MakeRequest) -> None:
    queue = PoolQueue()
    for i in range(10):
        queue.push(make_request("a", 2.0, at=i * 0.1))
    (flow,) = queue.backlog(1.0).flows
    assert (flow.tenant, flow.count, flow.cost) == ("a", 10, 20.0)
    assert flow.rate > 0
    queue.next_dispatch(1.0, [Credit("w", 10)])
    (idle,) = queue.backlog(1.0).flows  # still adding work, though nothing is queued
    assert idle.count == 0
    assert idle.rate == flow.rate
    assert queue.backlog(1000.0).flows == ()
