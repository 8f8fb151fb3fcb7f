"""The SLO policy: windows scaled to the period, burn rates, budgets, multi-window alerts."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from kiln_platform.slo.policy import (
    DAY_S,
    Counts,
    Objective,
    Sli,
    alerts,
    budget_remaining,
    burn_rate,
    evaluate,
    windows,
)
from kiln_platform.slo.sli import SliRecorder, Watched

NOW = datetime(2026, 12, 1, tzinfo=UTC)
MONTH = Objective("m", availability=0.999, latency=None, latency_ms=300.0)


def test_windows_are_the_workbooks_for_30_days_and_scale_with_the_period() -> None:
    assert windows(MONTH) == [300, 1800, 3600, 7200, 21600, DAY_S, 3 * DAY_S, 30 * DAY_S]
    six_hours = Objective("m", 0.99, None, 300.0, period_s=6 * 3600)
    assert windows(six_hours)[:3] == [2.5, 15.0, 30.0]  # 5m, 30m, 1h scaled by 1/120


def test_burn_rate_and_budget() -> None:
    counts = Counts(total=10_000, errors=5)
    assert burn_rate(counts, Sli.AVAILABILITY, 0.999) == pytest.approx(0.5)
    assert budget_remaining(counts, Sli.AVAILABILITY, 0.999) == pytest.approx(0.5)
    assert budget_remaining(Counts(total=100, errors=2), Sli.AVAILABILITY, 0.99) < 0
    assert burn_rate(Counts(), Sli.AVAILABILITY, 0.999) == 0.0


def _states(counts: dict[float, Counts]) -> dict[tuple[Sli, str], bool]:
    return alerts(evaluate(counts, MONTH, NOW))


def test_fast_burn_pages_only_when_both_windows_burn() -> None:
    hot = Counts(total=1000, errors=20)  # 2% errors: burn 20 > 14.4
    cold = Counts(total=1000, errors=0)
    assert _states({3600: hot, 300: hot})[Sli.AVAILABILITY, "page"]
    # the long window burned, but the errors stopped (short window quiet): resolved
    assert not _states({3600: hot, 300: cold})[Sli.AVAILABILITY, "page"]
    # a short spike alone does not page
    assert not _states({3600: cold, 300: hot})[Sli.AVAILABILITY, "page"]


def test_slow_burn_pages_and_tickets() -> None:
    warm = Counts(total=1000, errors=7)  # burn 7: above 6, below 14.4
    states = _states({21600: warm, 1800: warm, 3600: warm, 300: warm})
    assert states[Sli.AVAILABILITY, "page"]
    tepid = Counts(total=1000, errors=2)  # burn 2: only the 3d/6h ticket (burn 1)
    states = _states({3 * DAY_S: tepid, 21600: tepid, 3600: tepid, 300: tepid})
    assert states == {(Sli.AVAILABILITY, "page"): False, (Sli.AVAILABILITY, "ticket"): True}


def test_no_latency_objective_no_latency_alert_and_latency_uses_slow_counts() -> None:
    both = Objective("m", availability=0.999, latency=0.99, latency_ms=300.0)
    slow = Counts(total=100, errors=0, slow=50)
    fired = alerts(evaluate({3600: slow, 300: slow}, both, NOW))
    assert fired[Sli.LATENCY, "page"]
    assert not fired[Sli.AVAILABILITY, "page"]
    assert (Sli.LATENCY, "page") not in _states({3600: slow, 300: slow})


def test_recorder_counts_per_slo_and_bucket_ignoring_client_errors() -> None:
    recorder = SliRecorder(bucket_s=10)
    a, b = uuid.uuid4(), uuid.uuid4()
    recorder.watch([Watched(a, "m", None, 100.0), Watched(b, "m", "gold", 100.0)])
    recorder.observe("m", "standard", 200, 0.05, at=1005.0)
    recorder.observe("m", "standard", 504, 0.01, at=1009.0)
    recorder.observe("m", "standard", 200, 0.5, at=1011.0)
    recorder.observe("m", "standard", 429, 0.5, at=1011.0)  # the client's: not counted
    recorder.observe("m", "gold", 200, 0.01, at=1011.0)
    recorder.observe("other", "standard", 500, 0.01, at=1011.0)
    assert recorder.drain() == {
        (a, 1000.0): [2, 1, 0], (a, 1010.0): [2, 0, 1], (b, 1010.0): [1, 0, 0]
    }  # fmt: skip
    assert recorder.drain() == {}


def test_counts_that_could_not_be_stored_are_put_back() -> None:
    recorder = SliRecorder(bucket_s=10)
    slo = uuid.uuid4()
    recorder.watch([Watched(slo, "m", None, 100.0)])
    recorder.observe("m", "standard", 500, 0.5, at=1000.0)
    drained = recorder.drain()
    recorder.observe("m", "standard", 200, 0.01, at=1001.0)
    recorder.restore(drained)
    assert recorder.drain() == {(slo, 1000.0): [2, 1, 1]}
