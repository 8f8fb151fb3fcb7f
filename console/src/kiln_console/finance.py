"""The finance overview (finance's landing page): spend by tenant and by day for a period, and
this month to date against last month, from the same cost report as the costs page."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, date, datetime
from typing import Any

from litestar import Controller, get
from litestar.response import Template

from kiln_console.auth import KilnDep, Viewer, ViewerDep
from kiln_console.costs import From, Period, To, report
from kiln_console.reportform import Totals, form, month_of
from kiln_platform.reports import services as reports
from kiln_platform.reports.formats import money


async def spend(kiln: Any, viewer: Viewer, start: str, end: str, by: str) -> dict[str, int]:
    """Billed micro-units in ``[start, end)`` by tenant name or by day (``by``)."""
    sums: dict[str, int] = defaultdict(int)
    totals = Totals(None)
    q = reports.cost_query(viewer.actor, start, end, by, None)
    for row in await report(kiln, viewer, q, totals):
        label = row["BillingAccountName"] if by == "tenant" else row["ChargePeriodStart"][:10]
        sums[label] += row["x_BilledCostMicros"]
    return dict(sums)


def points(sums: dict[str, int]) -> list[tuple[str, float, str]]:
    """Chart points: (label, value in currency units, exact amount)."""
    return [(k, v / 1_000_000, money(v)) for k, v in sorted(sums.items())]


async def month_to_date(kiln: Any, viewer: Viewer, today: date) -> dict[str, str]:
    """This month so far, last month to the same day, and last month whole."""
    this, last = month_of(today), month_of(today, 1)
    same_day = last[0].replace(day=min(today.day, (last[1] - last[0]).days))
    spans = {"this_month": (this[0], today.toordinal() + 1),
             "last_month_to_date": (last[0], same_day.toordinal() + 1),
             "last_month": (last[0], last[1].toordinal())}  # fmt: skip
    out = {}
    for name, (start, end) in spans.items():
        stop = date.fromordinal(end).isoformat()
        out[name] = money(sum((await spend(kiln, viewer, start.isoformat(), stop, "tenant"))
                              .values()))  # fmt: skip
    return out


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
