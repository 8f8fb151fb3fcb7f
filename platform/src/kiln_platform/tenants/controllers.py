"""`/admin/v1/tenants`: thin handlers, behaviour in ``tenants.services``."""

from __future__ import annotations

import uuid

from litestar import delete, get, patch, post

from kiln_platform.admin.deps import ActorDep, AdminController, SessionDep
from kiln_platform.tenants import services
from kiln_platform.tenants.schemas import TenantCreate, TenantUpdate, TenantView


class TenantsController(AdminController):
    """Tenants."""

    opt = {"resource": "tenants"}  # noqa: RUF012 (admin.deps.authorize reads it)

    @get("/tenants")
    async def list_tenants(self, session: SessionDep, actor: ActorDep) -> list[TenantView]:
        """Tenants visible to the caller."""
        return await services.list_tenants(session, actor)

    @post("/tenants", status_code=201)
    async def create_tenant(
        self, session: SessionDep, actor: ActorDep, data: TenantCreate
    ) -> TenantView:
        """Create a tenant (platform-admin)."""
        return await services.create_tenant(session, actor, data)

    @get("/tenants/{tenant_id:uuid}")
    async def get_tenant(
        self, session: SessionDep, actor: ActorDep, tenant_id: uuid.UUID
    ) -> TenantView:
        """One tenant."""
        return await services.read_tenant(session, actor, tenant_id)

    @patch("/tenants/{tenant_id:uuid}")
    async def update_tenant(
        self, session: SessionDep, actor: ActorDep, tenant_id: uuid.UUID, data: TenantUpdate
    ) -> TenantView:
        """Rename a tenant or change its fair-share weight (platform-admin)."""
        return await services.update_tenant(session, actor, tenant_id, data)

    @delete("/tenants/{tenant_id:uuid}")
    async def delete_tenant(
        self, session: SessionDep, actor: ActorDep, tenant_id: uuid.UUID
    ) -> None:
        """Delete a tenant without metered usage (platform-admin)."""
        await services.delete_tenant(session, actor, tenant_id)
