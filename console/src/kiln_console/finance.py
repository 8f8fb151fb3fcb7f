"""The finance overview (finance's landing page): spend by tenant and by day for a period, and
this month to date against last month, from the same cost report as the costs page. Amounts in
different currencies are never added: each currency has its own figures and charts."""

from __future__ import annotations

from collections import defaultdict
from contextlib import aclosing
from datetime import UTC, date, datetime, timedelta
from typing import Any

from litestar import Controller, get
from litestar.response import Template

from kiln_console.auth import KilnDep, Viewer, ViewerDep
from kiln_console.costs import From, Period, To
from kiln_console.reportform import form, month_of
from kiln_platform.admin.deps import transaction
from kiln_platform.reports import services as reports
from kiln_platform.reports.formats import money

DEFAULT_CURRENCY = "USD"
"""The currency an empty period's charts are labelled in (the price book's default)."""
Spend = dict[str, dict[str, int]]
"""Billed micro-units by currency, then by label (a tenant's name or a day)."""


async def spend(kiln: Any, viewer: Viewer, start: str, end: str) -> tuple[Spend, Spend]:
    """Billed micro-units in ``[start, end)`` per currency, by tenant name and by day, from one
    report by tenant and day: every row of it (the costs table shows the first ``SHOWN``; a sum
    must not stop there)."""
    by_tenant: Spend = defaultdict(lambda: defaultdict(int))
    by_day: Spend = defaultdict(lambda: defaultdict(int))
    q = reports.cost_query(viewer.actor, start, end, "tenant,day", None)
    async with aclosing(reports.rows(lambda: transaction(kiln, viewer.actor), q)) as rows:
        async for row in rows:
            currency, micros = row["BillingCurrency"], row["x_BilledCostMicros"]
            by_tenant[currency][row["BillingAccountName"]] += micros
            by_day[currency][day_label(row)] += micros
    return _plain(by_tenant), _plain(by_day)


def day_label(row: dict[str, Any]) -> str:
    """``YYYY-MM-DD`` of a row's charge day in its tenant's zone.

    The day starts at the tenant's local midnight: for a tenant east of UTC that is an instant on
    the previous UTC date (after 10:00 UTC, offsets up to +14 h), for one west of it an instant
    on the same date (before 12:00 UTC, offsets down to -12 h). Between 10:00 and 12:00 either is
    possible, and the billing period's start says which: east of UTC it is not on the 1st.
    """
    start, period = (_instant(row[k]) for k in ("ChargePeriodStart", "BillingPeriodStart"))
    after = start - start.replace(hour=0, minute=0, second=0, microsecond=0)
    east = after > timedelta(hours=12) or (after >= timedelta(hours=10) and period.day != 1)
    return (start.date() + timedelta(days=east)).isoformat()


def _instant(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


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


async def month_to_date(kiln: Any, viewer: Viewer, today: date) -> list[dict[str, str]]:
    """Per currency: this month so far, last month to the same day, and last month whole; from
    one report by day from the first of last month to today."""
    this, last = month_of(today), month_of(today, 1)
    same_day = last[0].replace(day=min(today.day, (last[1] - last[0]).days))
    stop = date.fromordinal(today.toordinal() + 1).isoformat()
    by_currency = (await spend(kiln, viewer, last[0].isoformat(), stop))[1]
    since = {"this_month": (this[0], today), "last_month_to_date": (last[0], same_day),
             "last_month": (last[0], date.fromordinal(this[0].toordinal() - 1))}  # fmt: skip
    return [
        {"currency": currency} | {
            name: money(sum(v for d, v in days.items()
                            if first.isoformat() <= d <= end.isoformat()))
            for name, (first, end) in since.items()
        }
        for currency, days in sorted((by_currency or {DEFAULT_CURRENCY: {}}).items())
    ]  # fmt: skip


class Finance(Controller):
    """``/console/finance``."""

    opt = {"resource": "reports"}  # noqa: RUF012 (auth.authorize reads it)

    @get("/finance")
    async def overview(
        self, kiln: KilnDep, viewer: ViewerDep, *,
        period: Period = None, start: From = None, end: To = None,
    ) -> Template:  # fmt: skip
        """Spend by tenant and by day for a period (this month by default)."""
        today = datetime.now(UTC).date()
        f = form(today, period, start, end, None, tenant=None)
        by_tenant, by_day = await spend(kiln, viewer, f.start, f.end)
        context = {"viewer": viewer, "f": f, "mtd": await month_to_date(kiln, viewer, today),
                   "charts": charts(by_tenant, by_day)}  # fmt: skip
        return Template("finance.html.j2", context=context)
