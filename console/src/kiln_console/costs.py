"""The costs page: the admin API's cost report (same checks, same rows) as a table with totals
and subtotals, its CSV download (the same filters and grouping), and the months' statements.
Finance sees every tenant; a tenant-admin sees its own tenant only."""

from __future__ import annotations

import uuid
from contextlib import aclosing
from dataclasses import replace
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING, Annotated, Any

from litestar import Controller, Request, get
from litestar.params import Parameter
from litestar.response import Stream, Template

from kiln_console.auth import KilnDep, Viewer, ViewerDep
from kiln_console.errors import is_htmx
from kiln_console.reportform import DAY, MONTH, SUBTOTAL, Form, Totals, form, totals_for
from kiln_platform.admin.deps import transaction
from kiln_platform.errors import BadRequest
from kiln_platform.reports import services as reports
from kiln_platform.reports import statements
from kiln_platform.reports.formats import columns, money

if TYPE_CHECKING:
    from collections.abc import Callable

    from kiln_platform.reports._query import CostQuery

From = Annotated[str | None, Parameter(query="from", max_length=40)]
To = Annotated[str | None, Parameter(query="to", max_length=40)]
Period = Annotated[str | None, Parameter(max_length=20)]
Groups = Annotated[list[str] | None, Parameter(query="group")]
TenantId = Annotated[str | None, Parameter(query="tenant", max_length=40)]
SHOWN = 500
"""Rows the page shows; the CSV has them all, and the totals count them all."""


def _form(period: str | None, start: str | None, end: str | None, groups: list[str] | None,
          tenant: str | None) -> Form:  # fmt: skip
    return form(datetime.now(UTC).date(), period, start, end, groups, tenant=tenant)


def _query(viewer: Viewer, f: Form) -> CostQuery:
    try:
        tenant = uuid.UUID(f.tenant) if f.tenant else None
    except ValueError:
        raise BadRequest("'tenant' is not a tenant id.", param="tenant") from None
    return reports.cost_query(viewer.actor, f.start, f.end, f.group_by, tenant, local=True)


def console_row(record: Any) -> dict[str, Any]:
    """A report row (``columns``) with the console's own columns: its local month and day."""
    row = columns(record)
    local_month = record.period_start + timedelta(days=15)  # whatever the tenant's UTC offset
    row[MONTH] = f"{local_month.year:04d}-{local_month.month:02d}"
    row[DAY] = record.day and record.day.isoformat()
    return row


async def each_row(kiln: Any, viewer: Viewer, q: CostQuery, add: Callable[[Any], None]) -> None:
    """Pass every record of a report (``console_row`` makes a row of one) to ``add``, in one
    transaction that closes whatever ``add`` does."""
    records = reports.records(lambda: transaction(kiln, viewer.actor), q)
    async with aclosing(records) as each:
        async for record in each:
            add(record)


MonthKey = tuple[str, str, str, str]
"""A tenant's month: (name, id, ``YYYY-MM``, currency)."""


def add_month(sums: dict[MonthKey, int], row: dict[str, Any]) -> None:
    """Add a report row grouped by tenant to its tenant's month."""
    key = (row["BillingAccountName"], row["BillingAccountId"], row[MONTH], row["BillingCurrency"])
    sums[key] = sums.get(key, 0) + row["x_BilledCostMicros"]


async def report(
    kiln: Any, viewer: Viewer, q: CostQuery, totals: Totals, months: dict[MonthKey, int] | None
) -> tuple[list[dict[str, Any]], int]:
    """The first ``SHOWN`` rows of a report, and how many it has; in the same read, the report
    grouped by the subtotal's dimension only (few rows, the same sums) adds up ``totals`` and,
    if given (the subtotals are by tenant, every tenant's), ``months``."""
    by = {column: group for group, column in SUBTOTAL.items()}
    also = frozenset({by[totals.key]} if totals.key else ())
    shown: list[dict[str, Any]] = []
    count = 0

    def add(record: Any) -> None:
        nonlocal count
        row = console_row(record)
        if record.part == 0:
            shown.append(row)
            count = int(record.groups)
            return
        totals.add(row)
        if months is not None:
            add_month(months, row)

    await each_row(kiln, viewer, replace(q, limit=SHOWN, also=also), add)
    totals.rows = count
    return shown, count


async def month_sums(kiln: Any, viewer: Viewer, f: Form) -> dict[MonthKey, int]:
    """Each tenant's months in the range, from a report by tenant (when the page's own report
    is not grouped by tenant, or is filtered to one, so could not add them all up)."""
    q = reports.cost_query(viewer.actor, f.start, f.end, "tenant", None, local=True)
    sums: dict[MonthKey, int] = {}
    await each_row(kiln, viewer, q, lambda record: add_month(sums, console_row(record)))
    return sums


async def months(
    kiln: Any, viewer: Viewer, f: Form, sums: dict[MonthKey, int]
) -> list[dict[str, Any]]:
    """Each tenant's months in the range: billed so far, and the statement if it is closed."""
    first = date.fromisoformat(f.start[:8] + "01") - timedelta(days=31)
    async with transaction(kiln, viewer.actor) as session:
        closed = await statements.statements_in(session, viewer.actor, first,
                                                date.fromisoformat(f.end[:10]), None)  # fmt: skip
    by_key = {(str(s.tenant_id), s.period): s for s in closed}
    return [
        {"name": name, "id": tid, "month": month, "billed": money(micros), "currency": currency,
         "statement": by_key.get((tid, month))}
        for (name, tid, month, currency), micros in sorted(sums.items())
    ]  # fmt: skip


class Costs(Controller):
    """``/console/costs`` and ``/console/costs.csv``."""

    opt = {"resource": "reports"}  # noqa: RUF012 (auth.authorize reads it)

    @get("/costs")
    async def page(
        self, request: Request[Any, Any, Any], kiln: KilnDep, viewer: ViewerDep, *,
        period: Period = None, start: From = None, end: To = None, group: Groups = None,
        tenant: TenantId = None,
    ) -> Template:  # fmt: skip
        """The report for a period (this month by default), grouped as the checkboxes say."""
        f = _form(period, start, end, group, tenant)
        q, totals, sums = _query(viewer, f), totals_for(f.groups), dict[MonthKey, int]()
        # subtotals by tenant, every tenant's: the same read adds up their months too
        by_tenant = totals.key == "BillingAccountName" and not f.tenant
        rows, count = await report(kiln, viewer, q, totals, sums if by_tenant else None)
        if not by_tenant:
            sums = await month_sums(kiln, viewer, f)
        tenants = await months(kiln, viewer, f, sums)
        context = {"viewer": viewer, "rows": rows, "more": count > SHOWN, "f": f,
                   "totals": totals, "months": tenants,
                   "tenants": sorted({(r["name"], r["id"]) for r in tenants})}  # fmt: skip
        name = "_report.html.j2" if is_htmx(request) else "costs.html.j2"
        return Template(name, context=context)

    @get("/costs.csv")
    async def csv(
        self, kiln: KilnDep, viewer: ViewerDep, *,
        period: Period = None, start: From = None, end: To = None, group: Groups = None,
        tenant: TenantId = None,
    ) -> Stream:  # fmt: skip
        """The same report as CSV, streamed: the rows the table shows, all of them."""
        query = _query(viewer, _form(period, start, end, group, tenant))
        name = f"kiln-costs-{query.start:%Y%m%d}-{query.end:%Y%m%d}.csv"
        body = reports.stream_csv(lambda: transaction(kiln, viewer.actor), query)
        headers = {"content-disposition": f'attachment; filename="{name}"'}
        return Stream(body, media_type="text/csv; charset=utf-8", headers=headers)
