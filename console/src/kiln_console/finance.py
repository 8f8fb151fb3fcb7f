"""The finance overview (finance's landing page): spend by tenant and by day for a period, and
this month to date against last month, from the daily charge rollup the costs page's report
reads. Days and months are each tenant's local ones. Amounts in different currencies are never
added: each currency has its own figures and charts."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, date, datetime, timedelta
from typing import Any

from litestar import Controller, get
from litestar.response import Template

from kiln_console.auth import KilnDep, Viewer, ViewerDep
from kiln_console.costs import From, Period, To
from kiln_console.reportform import form, month_of
from kiln_platform.admin.deps import transaction
from kiln_platform.errors import BadRequest
from kiln_platform.reports import services as reports
from kiln_platform.reports.formats import money

DEFAULT_CURRENCY = "USD"
"""The currency an empty period's charts are labelled in (the price book's default)."""
Spend = dict[str, dict[str, int]]
"""Billed micro-units by currency, then by label (a tenant's name or a day)."""


async def spend(
    kiln: Any, viewer: Viewer, first: date, after: date, period: tuple[date, date]
) -> tuple[Spend, Spend]:
    """Billed micro-units per currency: by tenant name in ``period``, and by local day in
    ``[first, after)``; from one read of the daily charge rollup (``reports.spend``)."""
    by_tenant: Spend = defaultdict(lambda: defaultdict(int))
    by_day: Spend = defaultdict(lambda: defaultdict(int))
    scope = lambda: transaction(kiln, viewer.actor)  # noqa: E731
    for row in await reports.spend(scope, viewer.actor, first, after, period):
        if row.day is not None:
            by_day[row.currency][row.day.isoformat()] += int(row.micros)
        elif row.period_micros is not None:
            by_tenant[row.currency][row.tenant_name] += int(row.period_micros)
    return _plain(by_tenant), _plain(by_day)


def within(sums: Spend, first: date, after: date) -> Spend:
    """The days ``[first, after)`` of sums by day (a currency without any: left out)."""
    span = (first.isoformat(), after.isoformat())
    kept = {c: {d: v for d, v in days.items() if span[0] <= d < span[1]}
            for c, days in sums.items()}  # fmt: skip
    return {c: days for c, days in kept.items() if days}


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


def month_to_date(by_day: Spend, today: date) -> list[dict[str, str]]:
    """Per currency: this month so far, last month to the same day, and last month whole; from
    sums by day over last month and this month."""
    this, last = month_of(today), month_of(today, 1)
    same_day = last[0].replace(day=min(today.day, (last[1] - last[0]).days))
    spans = {"this_month": this, "last_month_to_date": (last[0], same_day + timedelta(days=1)),
             "last_month": last}  # fmt: skip
    return [
        {"currency": currency} | {
            name: money(sum(within({currency: days}, *span).get(currency, {}).values()))
            for name, span in spans.items()
        }
        for currency, days in sorted((by_day or {DEFAULT_CURRENCY: {}}).items())
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
        and the month to date come from one read of last month and this month."""
        today = datetime.now(UTC).date()
        f = form(today, period, start, end, None, tenant=None)
        span = (_day(f.start, "from"), _day(f.end, "to"))
        months = (month_of(today, 1)[0], month_of(today)[1])
        by_tenant, by_day = await spend(kiln, viewer, *months, span)
        mtd = month_to_date(by_day, today)
        if f.period == "custom":  # a preset is within the two months
            by_tenant, by_day = await spend(kiln, viewer, *span, span)
        context = {"viewer": viewer, "f": f, "mtd": mtd,
                   "charts": charts(by_tenant, within(by_day, *span))}  # fmt: skip
        return Template("finance.html.j2", context=context)
