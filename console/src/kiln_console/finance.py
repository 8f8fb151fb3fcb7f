"""The finance overview (finance's landing page): spend by tenant and by day for a period, and
this month to date against last month, from the same cost report as the costs page."""

from __future__ import annotations

from collections import defaultdict
from contextlib import aclosing
from datetime import UTC, date, datetime
from typing import Any

from litestar import Controller, get
from litestar.response import Template

from kiln_console.auth import KilnDep, Viewer, ViewerDep
from kiln_console.costs import From, Period, To
from kiln_console.reportform import form, month_of
from kiln_platform.admin.deps import transaction
from kiln_platform.reports import services as reports
from kiln_platform.reports.formats import money


async def spend(kiln: Any, viewer: Viewer, start: str, end: str, by: str) -> dict[str, int]:
    """Billed micro-units in ``[start, end)`` by tenant name or by day (``by``): every row of
    the report (the costs table shows the first ``SHOWN``; a sum must not stop there)."""
    sums: dict[str, int] = defaultdict(int)
    q = reports.cost_query(viewer.actor, start, end, by, None)
    async with aclosing(reports.rows(lambda: transaction(kiln, viewer.actor), q)) as rows:
        async for row in rows:
            label = row["BillingAccountName"] if by == "tenant" else row["ChargePeriodStart"][:10]
            sums[label] += row["x_BilledCostMicros"]
    return dict(sums)


def points(sums: dict[str, int]) -> list[tuple[str, float, str]]:
    """Chart points: (label, value in currency units, exact amount)."""
    return [(k, v / 1_000_000, money(v)) for k, v in sorted(sums.items())]


async def month_to_date(kiln: Any, viewer: Viewer, today: date) -> dict[str, str]:
    """This month so far, last month to the same day, and last month whole: one report by day
    from the first of last month to today."""
    this, last = month_of(today), month_of(today, 1)
    same_day = last[0].replace(day=min(today.day, (last[1] - last[0]).days))
    stop = date.fromordinal(today.toordinal() + 1).isoformat()
    days = await spend(kiln, viewer, last[0].isoformat(), stop, "day")
    since = {"this_month": (this[0], today), "last_month_to_date": (last[0], same_day),
             "last_month": (last[0], date.fromordinal(this[0].toordinal() - 1))}  # fmt: skip
    return {
        name: money(sum(v for d, v in days.items() if first.isoformat() <= d <= end.isoformat()))
        for name, (first, end) in since.items()
    }


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
        context = {
            "viewer": viewer, "f": f, "mtd": await month_to_date(kiln, viewer, today),
            "by_tenant": points(await spend(kiln, viewer, f.start, f.end, "tenant")),
            "by_day": points(await spend(kiln, viewer, f.start, f.end, "day")),
        }  # fmt: skip
        return Template("finance.html.j2", context=context)
