"""Accounting: Jain's index, max-min fair shares, sliding windows, percentiles."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import pytest

from kiln_platform.scheduler.schemas import Priority
from kiln_platform.scheduler.stats import (
    PoolStats,
    SlidingSums,
    fairness,
    jain_index,
    max_min_fair,
    percentile,
)

if TYPE_CHECKING:
    from tests.unit.scheduler.conftest import MakeRequest


def test_jain_index_bounds() -> None:
    assert jain_index([1.0, 1.0, 1.0]) == 1.0
    assert jain_index([1.0, 0.0, 0.0, 0.0]) == pytest.approx(0.25)
    assert jain_index([3.0, 1.0]) == pytest.approx(16 / 20)
    assert jain_index([]) == 1.0


def test_max_min_fair_gives_light_tenants_all_they_ask() -> None:
    fair = max_min_fair({"a": 1000.0, "b": 20.0}, {"a": 1.0, "b": 1.0}, 100.0)
    assert fair == pytest.approx({"a": 80.0, "b": 20.0})


def test_max_min_fair_splits_by_weight_when_all_saturate() -> None:
    fair = max_min_fair({"a": 1000.0, "b": 1000.0, "c": 5.0}, {"a": 3.0, "b": 1.0}, 105.0)
    assert fair == pytest.approx({"a": 75.0, "b": 25.0, "c": 5.0})


def test_fairness_is_one_for_a_noisy_neighbour_served_fairly() -> None:
    weights = {"a": 1.0, "b": 1.0}
    assert fairness({"a": 80.0, "b": 20.0}, {"a": 1000.0, "b": 20.0}, weights) == pytest.approx(1.0)
    assert fairness({"a": 95.0, "b": 5.0}, {"a": 1000.0, "b": 20.0}, weights) < 0.75


def test_percentile_is_nearest_rank() -> None:
    samples = [float(i) for i in range(1, 101)]
    assert percentile(samples, 50) == 50.0
    assert percentile(samples, 99) == 99.0
    assert percentile(samples, 100) == 100.0
    assert percentile([5.0], 99) == 5.0
    assert math.isnan(percentile([], 50))


def test_sliding_sums_forget_old_events() -> None:
    sums = SlidingSums(10.0)
    sums.add(0.0, "a", 5.0)
    sums.add(5.0, "b", 1.0)
    assert sums.totals(9.0) == {"a": 5.0, "b": 1.0}
    assert sums.totals(12.0) == {"b": 1.0}
    assert sums.totals(100.0) == {}


def test_sliding_sums_stay_bounded_when_never_read() -> None:
    """Without a metrics scrape nothing reads the sums: an hour of requests must not be kept
    (issue 23's soak: the gateway grew ~0.4 MiB/min)."""
    sums = SlidingSums(60.0)
    for i in range(3600 * 10):  # an hour at 10 requests/s, tenants coming and going
        sums.add(i / 10, f"tenant-{i // 6000}", 1.0)
    assert len(sums) <= 601
    assert list(sums.totals(3600.0)) == ["tenant-5"]  # the others left the window


def test_pool_stats_snapshot(make_request: MakeRequest) -> None:
    stats = PoolStats(window_s=60.0, max_samples=100)
    for i in range(10):
        a = make_request("a", 3.0, at=float(i))
        b = make_request("b", 1.0, at=float(i))
        for r in (a, b):
            stats.offered(float(i), r, None)
            stats.dispatched(float(i) + 0.5, r)
            stats.completed(float(i) + 1.0, r)
    stats.offered(10.0, make_request("a"), "tenant_over_share")
    stats.expired(make_request("b"))
    snap = stats.snapshot(10.0)
    sa, sb = snap.tenants
    assert (sa.admitted, sa.completed, sa.rejected) == (10, 10, {"tenant_over_share": 1})
    assert sb.rejected == {"deadline_expired": 1}
    assert sa.share == pytest.approx(0.75)
    assert sa.wait_p99_s == pytest.approx(0.5)
    assert sa.latency_p50_s == pytest.approx(1.0)
    assert 0.0 < snap.jain <= 1.0


def test_reset_starts_over(make_request: MakeRequest) -> None:
    stats = PoolStats()
    stats.offered(0.0, make_request(), None)
    stats.reset()
    assert stats.snapshot(1.0).tenants == ()


def test_fair_shares_follow_priority_classes(make_request: MakeRequest) -> None:
    stats = PoolStats(class_weights={Priority.INTERACTIVE: 0.9, Priority.BATCH: 0.1})
    for i in range(100):  # both classes offer 10 per round, the pool serves 10
        chat = make_request("chat", 10.0, at=float(i))
        job = make_request("job", 10.0, at=float(i), priority=Priority.BATCH)
        for r in (chat, job):
            stats.offered(float(i), r, None)
        stats.dispatched(float(i), make_request("chat", 9.0, at=float(i)))
        stats.dispatched(float(i), make_request("job", 1.0, at=float(i), priority=Priority.BATCH))
    snap = stats.snapshot(100.0)
    assert [t.fair_share for t in snap.tenants] == pytest.approx([0.9, 0.1])
    assert snap.jain == pytest.approx(1.0)
