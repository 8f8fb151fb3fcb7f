"""The models page: each model's versions, its route, and its pools' workers; platform-admins
change a route here (canary, promotion, rollback) through the same service as the admin API."""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, get, post
from litestar.response import Template

from kiln_console import forms
from kiln_console.auth import KilnDep, Viewer, ViewerDep
from kiln_platform.admin.deps import transaction
from kiln_platform.context import Kiln
from kiln_platform.registry import services
from kiln_platform.registry.schemas import RouteUpdate
from kiln_platform.registry.services import ModelRoutes


class Models(Controller):
    """``/console/models``."""

    opt = {"resource": "models"}  # noqa: RUF012 (auth.authorize reads it)

    @get("/models")
    async def page(self, kiln: KilnDep, viewer: ViewerDep) -> Template:
        """Models, versions, routes and pool sizes."""
        async with transaction(kiln, viewer.actor) as session:
            rows = await services.list_routes(session, viewer.actor)
        return Template("models.html.j2", context=_context(kiln, viewer, rows))

    @post("/models/{name:str}/route")
    async def route(
        self, request: Request[Any, Any, Any], kiln: KilnDep, viewer: ViewerDep, name: str
    ) -> Template:
        """Set a route from the form; the table comes back with it applied."""
        form = await request.form()
        fields = {
            "stable_version": str(form.get("stable_version", "")),
            "canary_version": str(form.get("canary_version") or "") or None,
            "canary_percent": forms.percent(str(form.get("canary_percent", "")), "canary_percent"),
        }
        data = forms.convert(fields, RouteUpdate)
        async with transaction(kiln, viewer.actor) as session:
            await services.set_route(
                session, viewer.actor, name, data, reconcile=kiln.pools.reconcile
            )
            rows = await services.list_routes(session, viewer.actor)
        # committed, and the pools reconciled: the sizes shown are the new route's
        return Template(
            "_models.html.j2", context={**_context(kiln, viewer, rows), "partial": True}
        )


def _context(kiln: Kiln, viewer: Viewer, rows: list[ModelRoutes]) -> dict[str, Any]:
    return {"viewer": viewer, "models": rows, "sizes": kiln.pools.sizes()}
