"""The audit log page: who changed what, newest first, filtered by action or actor; a
tenant-admin sees its tenant's records, a platform-admin everyone's."""

from __future__ import annotations

from typing import Annotated, Any

from litestar import Controller, Request, get
from litestar.params import Parameter
from litestar.response import Template

from kiln_console.auth import KilnDep, ViewerDep
from kiln_console.errors import is_htmx
from kiln_platform.admin.deps import transaction
from kiln_platform.audit.services import AuditFilter, list_records

PAGE = 50


class Audit(Controller):
    """``/console/audit``."""

    opt = {"resource": "audit"}  # noqa: RUF012 (auth.authorize reads it)

    @get("/audit")
    async def page(
        self, request: Request[Any, Any, Any], kiln: KilnDep, viewer: ViewerDep, *,
        action: Annotated[str | None, Parameter(max_length=64)] = None,
        actor: Annotated[str | None, Parameter(max_length=200)] = None,
        cursor: Annotated[int | None, Parameter(ge=1)] = None,
    ) -> Template:  # fmt: skip
        """A page of records (``cursor``: older than that record)."""
        where = AuditFilter(action=action or None, actor=actor or None)
        async with transaction(kiln, viewer.actor) as session:
            page = await list_records(session, viewer.actor, where, cursor, PAGE)
        context = {"viewer": viewer, "page": page, "action": action or "", "actor": actor or ""}
        return Template("_audit.html.j2" if is_htmx(request) else "audit.html.j2", context=context)
