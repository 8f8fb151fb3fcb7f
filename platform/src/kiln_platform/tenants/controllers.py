"""`/admin/v1/tenants`: thin handlers, behaviour in ``tenants.services``."""

from __future__ import annotations

import uuid

from litestar import delete, get, patch, post

from kiln_platform.admin.deps import AdminController, CallDep
from kiln_platform.tenants import services
from kiln_platform.tenants.schemas import TenantCreate, TenantUpdate, TenantView


class TenantsController(AdminController):
    """Tenants."""

    opt = {"resource": "tenants"}  # noqa: RUF012 (admin.deps.authorize reads it)

    @get("/tenants")
    async def list_tenants(self, call: CallDep) -> list[TenantView]:
        """Tenants visible to the caller."""
        return await services.list_tenants(await call.session(), call.actor)

    @post("/tenants", status_code=201)
    async def create_tenant(self, call: CallDep, data: TenantCreate) -> TenantView:
        """Create a tenant (platform-admin)."""
        return await services.create_tenant(await call.session(), call.actor, data)

    @get("/tenants/{tenant_id:uuid}")
    async def get_tenant(self, call: CallDep, tenant_id: uuid.UUID) -> TenantView:
        """One tenant."""
        return await services.read_tenant(await call.session(), call.actor, tenant_id)

    @patch("/tenants/{tenant_id:uuid}")
    async def update_tenant(
        self, call: CallDep, tenant_id: uuid.UUID, data: TenantUpdate
    ) -> TenantView:
        """Rename a tenant or change its fair-share weight (platform-admin)."""
        return await services.update_tenant(await call.session(), call.actor, tenant_id, data)

    @delete("/tenants/{tenant_id:uuid}")
    async def delete_tenant(self, call: CallDep, tenant_id: uuid.UUID) -> None:
        """Delete a tenant without metered usage (platform-admin)."""
        await services.delete_tenant(await call.session(), call.actor, tenant_id)
