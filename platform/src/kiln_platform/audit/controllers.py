"""`GET /admin/v1/audit`: thin handler, behaviour in ``audit.services``."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated

from litestar import get
from litestar.params import Parameter

from kiln_platform.admin.deps import AdminController, CallDep, transaction
from kiln_platform.audit import services
from kiln_platform.audit.schemas import AuditPage


class AuditController(AdminController):
    """The audit log (platform-admins: all tenants; tenant-admins: their own)."""

    opt = {"resource": "audit"}  # noqa: RUF012 (admin.deps.authorize reads it)

    @get("/audit")
    async def list_audit(
        self,
        *,
        call: CallDep,
        tenant_id: uuid.UUID | None = None,
        actor_name: Annotated[str | None, Parameter(query="actor", max_length=200)] = None,
        action: Annotated[str | None, Parameter(max_length=64)] = None,
        target_type: Annotated[str | None, Parameter(max_length=32)] = None,
        target_id: Annotated[str | None, Parameter(max_length=64)] = None,
        request_id: Annotated[str | None, Parameter(max_length=64)] = None,
        since: datetime | None = None,
        until: datetime | None = None,
        cursor: Annotated[int | None, Parameter(ge=1)] = None,
        limit: Annotated[int, Parameter(ge=1, le=services.MAX_PAGE)] = 50,
    ) -> AuditPage:
        """Audit records, newest first, filtered; next page: ``cursor`` = ``next_cursor``."""
        where = services.AuditFilter(
            tenant_id=tenant_id, actor=actor_name, action=action, target_type=target_type,
            target_id=target_id, request_id=request_id, since=since, until=until,
        )  # fmt: skip
        async with transaction(call.kiln, call.actor) as session:
            return await services.list_records(session, call.actor, where, cursor, limit)
