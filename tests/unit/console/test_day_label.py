"""The finance overview's day labels: the tenant's local day, whatever its UTC offset."""

from __future__ import annotations

from datetime import UTC, date, datetime
from zoneinfo import ZoneInfo

import pytest

from kiln_console.finance import day_label


def _row(zone: str, day: date) -> dict[str, str]:
    def utc(d: date) -> str:
        local = datetime(d.year, d.month, d.day, tzinfo=ZoneInfo(zone))
        return local.astimezone(UTC).isoformat().replace("+00:00", "Z")

    return {"ChargePeriodStart": utc(day), "BillingPeriodStart": utc(day.replace(day=1))}


@pytest.mark.parametrize(
    "zone",
    ["UTC", "Europe/Berlin", "Asia/Tokyo", "Pacific/Kiritimati", "Pacific/Auckland",
     "Pacific/Honolulu", "Etc/GMT+12", "America/New_York", "Europe/London", "Asia/Kolkata"],
)  # fmt: skip
@pytest.mark.parametrize("day", [date(2026, 1, 1), date(2026, 3, 31), date(2026, 7, 15)])
def test_the_label_is_the_local_day(zone: str, day: date) -> None:
    assert day_label(_row(zone, day)) == day.isoformat()
