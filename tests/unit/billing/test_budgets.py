"""Budget periods in the tenant's time zone, and the worst case a request can cost."""

from __future__ import annotations

import itertools
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from zoneinfo import ZoneInfo

import pytest

from kiln_platform.billing.budgets import period_end, period_of, worst_case
from kiln_platform.billing.pricing import PriceList, Quantities, charges, cost

BOOK = PriceList(
    version=1,
    effective_from=datetime(2026, 1, 1, tzinfo=UTC),
    prices={
        ("*", "*", "request"): Decimal(7),
        ("chat", "*", "input_token"): Decimal("0.15"),
        ("chat", "*", "output_token"): Decimal("0.6"),
        ("cnn", "*", "item"): Decimal("2.5"),
        ("cnn", "*", "compute_second"): Decimal(2000),
    },
    discounts_bps={"enterprise": 2_000},
)


@pytest.mark.parametrize(
    ("zone", "when", "period"),
    [
        ("UTC", datetime(2026, 3, 31, 23, 59, 59, 999999, tzinfo=UTC), date(2026, 3, 1)),
        ("UTC", datetime(2026, 4, 1, 0, 0, tzinfo=UTC), date(2026, 4, 1)),
        # Ahead of UTC: the new month starts before UTC's.
        ("Pacific/Auckland", datetime(2026, 3, 31, 11, 0, tzinfo=UTC), date(2026, 4, 1)),
        ("Pacific/Auckland", datetime(2026, 3, 31, 10, 59, tzinfo=UTC), date(2026, 3, 1)),
        # Behind UTC: still last month (and last year) for a while.
        ("America/Los_Angeles", datetime(2027, 1, 1, 7, 59, tzinfo=UTC), date(2026, 12, 1)),
        ("America/Los_Angeles", datetime(2027, 1, 1, 8, 0, tzinfo=UTC), date(2027, 1, 1)),
        # DST: Los Angeles is UTC-7 in summer, so 1 July starts at 07:00 UTC, not 08:00.
        ("America/Los_Angeles", datetime(2026, 7, 1, 7, 0, tzinfo=UTC), date(2026, 7, 1)),
        ("America/Los_Angeles", datetime(2026, 7, 1, 6, 59, tzinfo=UTC), date(2026, 6, 1)),
        # Half-hour zone; a naive local clock given with an offset is the same instant.
        ("Asia/Kolkata", datetime(2026, 1, 31, 18, 30, tzinfo=UTC), date(2026, 2, 1)),
        ("UTC", datetime(2026, 2, 1, 0, 30, tzinfo=ZoneInfo("Asia/Kolkata")), date(2026, 1, 1)),
    ],
)
def test_period_is_the_calendar_month_in_the_tenant_zone(
    zone: str, when: datetime, period: date
) -> None:
    assert period_of(zone, when) == period


def test_period_end_is_the_next_local_midnight_across_dst_and_years() -> None:
    la = "America/Los_Angeles"
    assert period_end(la, date(2026, 3, 1)) == datetime(2026, 4, 1, 7, tzinfo=UTC)  # PDT
    assert period_end(la, date(2026, 11, 1)) == datetime(2026, 12, 1, 8, tzinfo=UTC)  # PST
    assert period_end("UTC", date(2026, 12, 1)) == datetime(2027, 1, 1, tzinfo=UTC)
    for zone, month in itertools.product(("UTC", la, "Pacific/Auckland"), range(1, 13)):
        start = date(2026, month, 1)
        end = period_end(zone, start)
        assert period_of(zone, end - timedelta(microseconds=1)) == start
        assert period_of(zone, end) == date(2026 + month // 12, month % 12 + 1, 1)


def test_worst_case_prices_the_maximum_quantities_after_discount() -> None:
    most = Quantities(input_tokens=1000, output_tokens=256)
    # 150 + 153.6 -> 154 + 7 per request
    assert worst_case(BOOK, "chat", "1", "standard", most) == 150 + 154 + 7
    assert worst_case(BOOK, "chat", "1", "enterprise", most) == 120 + 123 + 6  # 20% off
    assert worst_case(None, "chat", "1", "standard", most) == 0  # no price book: free


def test_tensor_worst_case_bounds_compute_by_the_timeout() -> None:
    most = Quantities(items=4, compute_ms=30_000.0)
    assert (
        worst_case(BOOK, "cnn", "1", "standard", most) == 10 + 60_000 + 7
    )  # 4 x 2.5, 30 s x 2000, the request


@pytest.mark.parametrize("plan", ["standard", "enterprise"])
def test_nothing_that_fits_in_the_maximum_costs_more_than_the_worst_case(plan: str) -> None:
    most = Quantities(input_tokens=333, output_tokens=77, compute_ms=1234.5)
    held = worst_case(BOOK, "chat", "1", plan, most)
    for out in range(78):
        used = Quantities(input_tokens=333, output_tokens=out, compute_ms=out * 10.0)
        assert cost(charges(BOOK, "chat", "1", plan, used))[1] <= held
