"""The costs page: the admin API's cost report (same checks, same rows) as a table, and its CSV
download. Finance sees every tenant; a tenant-admin sees its own tenant only."""

from __future__ import annotations

from contextlib import aclosing
from datetime import UTC, date, datetime
from typing import Annotated, Any, NamedTuple

from litestar import Controller, Request, get
from litestar.params import Parameter
from litestar.response import Stream, Template

from kiln_console.auth import KilnDep, ViewerDep
from kiln_console.errors import is_htmx
from kiln_platform.admin.deps import transaction
from kiln_platform.reports import services as reports

From = Annotated[str | None, Parameter(query="from", max_length=40)]
To = Annotated[str | None, Parameter(query="to", max_length=40)]
Groups = Annotated[str | None, Parameter(max_length=200)]
SHOWN = 500
"""Rows the page shows; the CSV has them all."""


def _month(today: date) -> tuple[str, str]:
    """This calendar month (UTC) as ``from``/``to`` dates."""
    first = today.replace(day=1)
    after = first.replace(year=first.year + first.month // 12, month=first.month % 12 + 1)
    return first.isoformat(), after.isoformat()


class Report(NamedTuple):
    """The report's parameters as the form shows them."""

    start: str
    end: str
    group_by: str


def _form(start: str | None, end: str | None, group_by: str | None) -> Report:
    """The report's parameters, defaults filled in: this month, by tenant and model."""
    first, after = _month(datetime.now(UTC).date())
    return Report(start or first, end or after, group_by or "tenant,model")


class Costs(Controller):
    """``/console/costs`` and ``/console/costs.csv``."""

    opt = {"resource": "reports"}  # noqa: RUF012 (auth.authorize reads it)

    @get("/costs")
    async def page(
        self, request: Request[Any, Any, Any], kiln: KilnDep, viewer: ViewerDep, *,
        start: From = None, end: To = None, group_by: Groups = None,
    ) -> Template:  # fmt: skip
        """The report for ``[from, to)`` (this month by default), grouped by ``group_by``."""
        form = _form(start, end, group_by)
        query = reports.cost_query(viewer.actor, *form, None)
        shown: list[dict[str, Any]] = []
        scope = lambda: transaction(kiln, viewer.actor)  # noqa: E731
        async with aclosing(reports.rows(scope, query)) as rows:
            async for row in rows:
                shown.append(row)
                if len(shown) > SHOWN:
                    break
        context = {"viewer": viewer, "rows": shown[:SHOWN], "more": len(shown) > SHOWN}
        name = "_report.html.j2" if is_htmx(request) else "costs.html.j2"
        return Template(name, context={**context, **form._asdict()})

    @get("/costs.csv")
    async def csv(
        self, kiln: KilnDep, viewer: ViewerDep, *,
        start: From = None, end: To = None, group_by: Groups = None,
    ) -> Stream:  # fmt: skip
        """The same report as CSV, streamed."""
        query = reports.cost_query(viewer.actor, *_form(start, end, group_by), None)
        name = f"kiln-costs-{query.start:%Y%m%d}-{query.end:%Y%m%d}.csv"
        body = reports.stream_csv(lambda: transaction(kiln, viewer.actor), query)
        headers = {"content-disposition": f'attachment; filename="{name}"'}
        return Stream(body, media_type="text/csv; charset=utf-8", headers=headers)
