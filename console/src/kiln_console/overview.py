"""The landing page: a tenant's usage, latency, spend and limits, or (platform-admin) the fleet:
traffic and errors per model, live pools, top tenants. Its panel polls itself every 5 s; the
numbers come from the hourly rollup (``reports.overview``), the pools from the pool manager."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from litestar import Controller, Request, get
from litestar.params import Parameter
from litestar.response import Template

from kiln_console.auth import KilnDep, ViewerDep
from kiln_console.errors import is_htmx
from kiln_platform.admin.authz import Role
from kiln_platform.admin.deps import transaction
from kiln_platform.reports import overview
from kiln_platform.tenants import services as tenants

RangeParam = Annotated[str | None, Parameter(query="range", max_length=8)]


class Overview(Controller):
    """``/console/overview``: the full page, or its panel when htmx polls."""

    opt = {"resource": "overview"}  # noqa: RUF012 (auth.authorize reads it)

    @get("/overview")
    async def page(
        self, request: Request[Any, Any, Any], kiln: KilnDep, viewer: ViewerDep,
        range_: RangeParam = None,
    ) -> Template:  # fmt: skip
        """The viewer's overview for today, 7 or 30 days."""
        now = datetime.now(UTC)
        context: dict[str, Any] = {"viewer": viewer, "ranges": overview.RANGES, "now": now}
        async with transaction(kiln, viewer.actor) as session:
            if viewer.role is Role.PLATFORM_ADMIN:
                fleet = await overview.fleet_overview(session, viewer.actor, range_, now)
                context.update(fleet=fleet, range=fleet.range, pools=kiln.pools.live())
            else:
                assert viewer.home_tenant is not None  # tenant roles have one (auth.Viewer)
                tenant = await tenants.get_tenant(session, viewer.actor, viewer.home_tenant)
                data = await overview.tenant_overview(
                    session, viewer.actor, tenant.id, range_, now, platform=kiln.db.sessions
                )
                context.update(tenant=tenant, data=data, range=data.range)
        name = "_overview_panel.html.j2" if is_htmx(request) else "overview.html.j2"
        return Template(name, context=context)
