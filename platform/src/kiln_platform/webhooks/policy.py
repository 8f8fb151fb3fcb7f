"""When a failed webhook delivery is tried again: exponential backoff with jitter, capped, until
its retry window closes (pure: the sender and the unit tests drive it)."""

from __future__ import annotations

from datetime import datetime, timedelta

MAX_DELAY_S = 3 * 3600.0
"""No wait between two attempts is longer than this (the last tries of a day stay hourly)."""


def retry_at(
    now: datetime, window_from: datetime, attempts: int, *, base_s: float,
    window_s: float, jitter: float,
) -> datetime | None:  # fmt: skip
    """When to try again after ``attempts`` failed ones: ``base_s * 2**(attempts-1)`` (capped at
    ``MAX_DELAY_S``) scaled by ``jitter`` in [0.5, 1) so many failed deliveries spread out;
    None once that is past ``window_from + window_s`` (the delivery has failed)."""
    delay = min(base_s * 2 ** min(attempts - 1, 40), MAX_DELAY_S) * (0.5 + jitter / 2)
    at = now + timedelta(seconds=delay)
    return at if at <= window_from + timedelta(seconds=window_s) else None
