"""`/admin/v1/models/{name}/shadow`: a model's shadow candidate and its comparison report."""

from __future__ import annotations

from litestar import delete, get, put

from kiln_platform.admin.deps import AdminController, CallDep
from kiln_platform.shadow import services
from kiln_platform.shadow.schemas import ShadowUpdate, ShadowView


class ShadowController(AdminController):
    """Shadow traffic (platform-admin only: the report spans every tenant's requests)."""

    opt = {"resource": services.RESOURCE}  # noqa: RUF012 (admin.deps.authorize reads it)

    @get("/models/{name:str}/shadow")
    async def get_shadow(self, call: CallDep, name: str) -> ShadowView:
        """The candidate, its share, and every gateway's comparison (this one's live)."""
        live = call.kiln.shadows.reports()
        return await services.view(await call.session(), call.actor, name, live)

    @put("/models/{name:str}/shadow")
    async def set_shadow(self, call: CallDep, name: str, data: ShadowUpdate) -> ShadowView:
        """Copy a share of the model's requests to a candidate version (audited); its pool is
        started; copies are never billed and never delay the answer."""
        return await services.set_shadow(
            await call.session(), call.actor, name, data, reconcile=call.kiln.pools.reconcile
        )

    @delete("/models/{name:str}/shadow", status_code=204)
    async def delete_shadow(self, call: CallDep, name: str) -> None:
        """Stop copying the model's requests."""
        await services.delete_shadow(
            await call.session(), call.actor, name, reconcile=call.kiln.pools.reconcile
        )
