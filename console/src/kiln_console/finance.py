"""The finance overview (finance's landing page): spend by tenant and by day for a period, and
this month to date against last month, from the same cost report as the costs page. Days and
months are each tenant's local ones. Amounts in different currencies are never added: each
currency has its own figures and charts."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, date, datetime, timedelta
from typing import Any

from litestar import Controller, get
from litestar.response import Template

from kiln_console.auth import KilnDep, Viewer, ViewerDep
from kiln_console.costs import From, Period, To, each_row
from kiln_console.reportform import form, month_of
from kiln_platform.errors import BadRequest
from kiln_platform.reports import services as reports
from kiln_platform.reports.formats import money

DEFAULT_CURRENCY = "USD"
"""The currency an empty period's charts are labelled in (the price book's default)."""
Spend = dict[str, dict[str, int]]
"""Billed micro-units by currency, then by label (a tenant's name or a day)."""
Days = dict[str, dict[tuple[str, date], int]]
"""Billed micro-units by currency, then by tenant name and local day."""


async def spend(kiln: Any, viewer: Viewer, first: date, after: date) -> Days:
    """Billed micro-units of the local days ``[first, after)`` per currency, tenant and day,
    from one report by tenant and day: every row of it (the costs table shows the first
    ``SHOWN``; a sum must not stop there)."""
    days: Days = defaultdict(lambda: defaultdict(int))
    q = reports.cost_query(viewer.actor, first.isoformat(), after.isoformat(), "tenant,day",
                           None, local=True)  # fmt: skip

    def add(row: Any) -> None:
        days[row.currency][(row.tenant_name, row.day)] += int(row.cost_micros)

    await each_row(kiln, viewer, q, add, reports.records)
    return {currency: dict(by_day) for currency, by_day in days.items()}


def totals(days: Days, first: date, after: date) -> tuple[Spend, Spend]:
    """Per currency, the days ``[first, after)`` summed by tenant name and by day."""
    by_tenant: Spend = defaultdict(lambda: defaultdict(int))
    by_day: Spend = defaultdict(lambda: defaultdict(int))
    for currency, sums in days.items():
        for (tenant, day), micros in sums.items():
            if first <= day < after:
                by_tenant[currency][tenant] += micros
                by_day[currency][day.isoformat()] += micros
    return _plain(by_tenant), _plain(by_day)


def _plain(sums: Spend) -> Spend:
    return {currency: dict(by_label) for currency, by_label in sums.items()}


def points(sums: dict[str, int]) -> list[tuple[str, float, str]]:
    """Chart points: (label, value in currency units, exact amount)."""
    return [(k, v / 1_000_000, money(v)) for k, v in sorted(sums.items())]


def charts(by_tenant: Spend, by_day: Spend) -> list[dict[str, Any]]:
    """One pair of charts per currency (in order; one empty pair when nothing was billed)."""
    currencies = sorted(by_tenant.keys() | by_day.keys()) or [DEFAULT_CURRENCY]
    return [
        {"currency": c, "by_tenant": points(by_tenant.get(c, {})),
         "by_day": points(by_day.get(c, {}))}
        for c in currencies
    ]  # fmt: skip


def month_to_date(days: Days, today: date) -> list[dict[str, str]]:
    """Per currency: this month so far, last month to the same day, and last month whole; from
    the days of last month and this month."""
    this, last = month_of(today), month_of(today, 1)
    same_day = last[0].replace(day=min(today.day, (last[1] - last[0]).days))
    spans = {"this_month": this, "last_month_to_date": (last[0], same_day + timedelta(days=1)),
             "last_month": last}  # fmt: skip
    by_day = totals(days, last[0], this[1])[1]
    return [
        {"currency": currency} | {
            name: money(sum(v for d, v in sums.items()
                            if first.isoformat() <= d < after.isoformat()))
            for name, (first, after) in spans.items()
        }
        for currency, sums in sorted((by_day or {DEFAULT_CURRENCY: {}}).items())
    ]  # fmt: skip


def _day(value: str, param: str) -> date:
    try:
        return date.fromisoformat(value[:10])
    except ValueError:
        raise BadRequest(f"'{param}' is not a date: {value!r}.", param=param) from None


class Finance(Controller):
    """``/console/finance``."""

    opt = {"resource": "reports"}  # noqa: RUF012 (auth.authorize reads it)

    @get("/finance")
    async def overview(
        self, kiln: KilnDep, viewer: ViewerDep, *,
        period: Period = None, start: From = None, end: To = None,
    ) -> Template:  # fmt: skip
        """Spend by tenant and by day for a period (this month by default); a preset's charts
        and the month to date come from one report of last month and this month."""
        today = datetime.now(UTC).date()
        f = form(today, period, start, end, None, tenant=None)
        first, after = _day(f.start, "from"), _day(f.end, "to")
        both = await spend(kiln, viewer, month_of(today, 1)[0], month_of(today)[1])
        days = both if f.period != "custom" else await spend(kiln, viewer, first, after)
        context = {"viewer": viewer, "f": f, "mtd": month_to_date(both, today),
                   "charts": charts(*totals(days, first, after))}  # fmt: skip
        return Template("finance.html.j2", context=context)
