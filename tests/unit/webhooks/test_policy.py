"""The retry schedule of a failed webhook delivery: doubling, jittered, capped, a day long."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from kiln_platform.webhooks.policy import MAX_DELAY_S, retry_at

T0 = datetime(2026, 12, 1, tzinfo=UTC)
DAY = 86400.0


def _delay(attempts: int, jitter: float, base_s: float = 10.0) -> float:
    at = retry_at(T0, T0, attempts, base_s=base_s, window_s=DAY, jitter=jitter)
    assert at is not None
    return (at - T0).total_seconds()


def test_the_delay_doubles_each_attempt_within_its_jitter() -> None:
    assert [_delay(n, 0.0) for n in (1, 2, 3, 4)] == [5.0, 10.0, 20.0, 40.0]
    assert [_delay(n, 0.999) for n in (1, 2)] == pytest.approx([10.0 * 0.9995, 20.0 * 0.9995])


def test_the_delay_is_capped() -> None:
    assert _delay(30, 0.999) <= MAX_DELAY_S
    assert _delay(10_000, 0.0) == MAX_DELAY_S / 2


def test_no_retry_past_the_window() -> None:
    late = T0 + timedelta(seconds=DAY - 1)
    assert retry_at(late, T0, 3, base_s=10.0, window_s=DAY, jitter=0.0) is None
    assert retry_at(late, late, 3, base_s=10.0, window_s=DAY, jitter=0.0) is not None


def test_a_day_of_retries_is_a_bounded_number_of_attempts() -> None:
    now, attempts = T0, 0
    while True:
        attempts += 1
        nxt = retry_at(now, T0, attempts, base_s=10.0, window_s=DAY, jitter=0.5)
        if nxt is None:
            break
        now = nxt
    assert 10 < attempts < 40
    assert now - T0 <= timedelta(days=1)
