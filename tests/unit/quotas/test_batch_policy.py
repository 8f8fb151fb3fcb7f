"""Batch quotas' pure policy: a line's estimated tokens, the tenant-local day, refusals, and
when a line waits for the next day."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from kiln_platform.quotas.batch_policy import day_of, line_tokens, line_waits, refusal


@pytest.mark.parametrize(
    ("body", "tokens"),
    [
        ({"model": "m", "input": "abcdefgh"}, 2),
        ({"model": "m", "input": ["abcd", "abcde"]}, 3),  # 9 characters
        ({"model": "m", "input": [[1, 2, 3], [4]]}, 4),  # token ids count one each
        ({"model": "m", "prompt": "abcd", "max_tokens": 10}, 11),
        ({"model": "a-long-model-name", "messages": [
            {"role": "system", "content": "abcd"},
            {"role": "user", "content": [{"type": "text", "text": "abcdabcd"}]},
        ], "max_completion_tokens": 5, "max_tokens": 99}, 8),  # the newer field wins
        ({"model": "m", "input": "", "max_tokens": True}, 0),  # not a count
    ],
)  # fmt: skip
def test_line_tokens_count_text_ids_and_requested_output(body: dict[str, Any], tokens: int) -> None:
    assert line_tokens(body) == tokens


def test_the_day_is_the_tenants_local_day() -> None:
    at = datetime(2026, 12, 2, 3, 0, tzinfo=UTC)  # still Dec 1 in New York (UTC-5)
    start, end = day_of("America/New_York", at)
    assert (start, end) == (
        datetime(2026, 12, 1, 5, tzinfo=UTC),
        datetime(2026, 12, 2, 5, tzinfo=UTC),
    )
    assert day_of("UTC", at) == (
        datetime(2026, 12, 2, tzinfo=UTC),
        datetime(2026, 12, 3, tzinfo=UTC),
    )
    assert day_of("America/New_York", end)[0] == end  # midnight begins the next day


def test_a_day_across_a_clock_change_has_its_real_length() -> None:
    start, end = day_of("Europe/Berlin", datetime(2026, 3, 29, 12, tzinfo=UTC))
    assert (end - start).total_seconds() == 23 * 3600


def test_a_batch_fits_or_is_refused_naming_the_limit() -> None:
    assert refusal("batch_enqueued_tokens", 1000, 600, 400, today=False) is None
    why = refusal("batch_enqueued_tokens", 1000, 600, 401, today=False)
    assert why is not None
    assert "batch_enqueued_tokens is 1,000 tokens;" in why
    assert "600 are enqueued in open batches" in why
    assert "401" in why
    daily = refusal("batch_tokens_per_day", 1000, 1200, 1, today=True)
    assert daily is not None
    assert "1,000 tokens per day" in daily
    assert "tomorrow" in daily


def test_a_line_waits_only_when_it_would_pass_the_days_limit() -> None:
    assert not line_waits(100, 0, 500)  # the day's first line starts whatever its size
    assert not line_waits(100, 60, 40)
    assert line_waits(100, 60, 41)
    assert line_waits(100, 100, 0) is False  # nothing to add: it does not pass the limit
    assert line_waits(100, 101, 0)
