"""`/admin/v1/models/{name}/route`: thin handlers, behaviour in ``registry.routes``."""

from __future__ import annotations

from litestar import get, put

from kiln_platform.admin.controllers import ActorDep, AdminController, KilnDep
from kiln_platform.admin.deps import transaction
from kiln_platform.registry import routes
from kiln_platform.registry.schemas import RouteUpdate, RouteView


class RoutesController(AdminController):
    """Which versions of a model serve (canary, promotion, rollback)."""

    opt = {"resource": "models"}  # noqa: RUF012 (admin.deps.authorize reads it)

    @get("/models/{name:str}/route")
    async def get_route(self, kiln: KilnDep, actor: ActorDep, name: str) -> RouteView:
        """A model's route (without one, the newest version serves)."""
        async with transaction(kiln, actor) as session:
            return await routes.get_route(session, actor, name)

    @put("/models/{name:str}/route")
    async def set_route(
        self, kiln: KilnDep, actor: ActorDep, name: str, data: RouteUpdate
    ) -> RouteView:
        """Set the stable version and an optional canary share (platform-admin); this gateway
        applies it at once, others within their 2 s refresh."""
        async with transaction(kiln, actor) as session:
            view = await routes.set_route(session, actor, name, data)
        await kiln.pools.reconcile()
        return view
