"""`/admin/v1/reports/costs`, statements and adjustments: thin handlers, behaviour in services."""

from __future__ import annotations

import uuid
from typing import Annotated, Any

from litestar import Request, get, post
from litestar.openapi import ResponseSpec
from litestar.params import Parameter
from litestar.response import Stream

from kiln_platform.admin.deps import AdminController, CallDep, transaction
from kiln_platform.reports import services, statements
from kiln_platform.reports.schemas import AdjustmentCreate, AdjustmentView, StatementView

MEDIA = {"csv": "text/csv; charset=utf-8", "json": "application/json"}
Period = Annotated[str, Parameter(pattern=r"^\d{4}-\d{2}$", description="YYYY-MM")]


STATEMENTS = {"resource": "statements"}
ADJUSTMENTS = {"resource": "adjustments"}


class ReportsController(AdminController):
    """Finance: cost reports (JSON or CSV), monthly statements, adjustments."""

    opt = {"resource": "reports"}  # noqa: RUF012 (admin.deps.authorize reads it)

    @get(
        "/reports/costs",
        responses={200: ResponseSpec(None, description="JSON or CSV (docs/billing.md)",
                                     media_type="text/csv", generate_examples=False)},
    )  # fmt: skip
    async def costs(
        self,
        *,
        request: Request[Any, Any, Any],
        call: CallDep,
        start: Annotated[str, Parameter(query="from", max_length=40)],
        end: Annotated[str, Parameter(query="to", max_length=40)],
        group_by: Annotated[str | None, Parameter(max_length=200)] = None,
        tenant_id: uuid.UUID | None = None,
        fmt: Annotated[str | None, Parameter(query="format", max_length=8)] = None,
    ) -> Stream:
        """Costs in ``[from, to)`` grouped by ``group_by`` (tenant, model, version, key, day,
        request), streamed; ``format=csv`` or ``Accept: text/csv`` for CSV."""
        query = services.cost_query(call.actor, start, end, group_by, tenant_id)
        kind = services.report_format(fmt, request.headers.get("accept"))
        encode = services.stream_csv if kind == "csv" else services.stream_json
        headers = {}
        if kind == "csv":
            name = f"kiln-costs-{query.start:%Y%m%dT%H%M%S}-{query.end:%Y%m%dT%H%M%S}.csv"
            headers["content-disposition"] = f'attachment; filename="{name}"'
        body = encode(lambda: transaction(call.kiln, call.actor), query)
        return Stream(body, media_type=MEDIA[kind], headers=headers)

    @get("/tenants/{tenant_id:uuid}/statements", opt=STATEMENTS)
    async def list_statements(self, call: CallDep, tenant_id: uuid.UUID) -> list[StatementView]:
        """A tenant's closed monthly statements, newest first."""
        return await statements.list_statements(await call.session(), call.actor, tenant_id)

    @get("/tenants/{tenant_id:uuid}/statements/{period:str}", opt=STATEMENTS)
    async def get_statement(
        self, call: CallDep, tenant_id: uuid.UUID, period: Period
    ) -> StatementView:
        """One closed statement (``YYYY-MM``)."""
        return await statements.get_statement(await call.session(), call.actor, tenant_id, period)

    @post(
        "/tenants/{tenant_id:uuid}/statements/{period:str}/close", status_code=201, opt=STATEMENTS
    )
    async def close_statement(
        self, call: CallDep, tenant_id: uuid.UUID, period: Period
    ) -> StatementView:
        """Close a month that is over, in the tenant's time zone (platform-admin; twice: 409)."""
        return await statements.close_statement(await call.session(), call.actor, tenant_id, period)

    @post("/tenants/{tenant_id:uuid}/adjustments", status_code=201, opt=ADJUSTMENTS)
    async def create_adjustment(
        self, call: CallDep, tenant_id: uuid.UUID, data: AdjustmentCreate
    ) -> AdjustmentView:
        """A correction charged now, naming the month it corrects (platform-admin)."""
        return await statements.create_adjustment(await call.session(), call.actor, tenant_id, data)
