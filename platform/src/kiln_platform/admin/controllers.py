"""`/admin/v1` tenants and API keys: thin handlers, behaviour in ``admin.services``."""

from __future__ import annotations

import uuid

from litestar import delete, get, patch, post
from litestar.di import Provide
from litestar.params import SkipValidation

from kiln_platform.admin import services
from kiln_platform.admin.authz import Actor
from kiln_platform.admin.deps import authorize, provide_actor, transaction
from kiln_platform.admin.problems import DocumentedController
from kiln_platform.admin.schemas import (
    KeyCreate,
    KeyCreated,
    KeyView,
    TenantCreate,
    TenantUpdate,
    TenantView,
)
from kiln_platform.context import Kiln

KilnDep = SkipValidation[Kiln]
ActorDep = SkipValidation[Actor]
KEYS = {"resource": "keys"}


class AdminController(DocumentedController):
    """Base of the admin controllers: every handler is authorized by ``authorize`` (its
    ``opt["resource"]`` read or written, before its body is read) and gets the ``actor``."""

    path = "/admin/v1"
    guards = [authorize]  # noqa: RUF012
    dependencies = {"actor": Provide(provide_actor)}  # noqa: RUF012
    tags = ["admin"]  # noqa: RUF012


class TenantsController(AdminController):
    """Tenants and their API keys."""

    opt = {"resource": "tenants"}  # noqa: RUF012 (admin.deps.authorize reads it)

    @get("/tenants")
    async def list_tenants(self, kiln: KilnDep, actor: ActorDep) -> list[TenantView]:
        """Tenants visible to the caller."""
        async with transaction(kiln, actor) as session:
            return await services.list_tenants(session, actor)

    @post("/tenants", status_code=201)
    async def create_tenant(self, kiln: KilnDep, actor: ActorDep, data: TenantCreate) -> TenantView:
        """Create a tenant (platform-admin)."""
        async with transaction(kiln, actor) as session:
            return await services.create_tenant(session, actor, data)

    @get("/tenants/{tenant_id:uuid}")
    async def get_tenant(self, kiln: KilnDep, actor: ActorDep, tenant_id: uuid.UUID) -> TenantView:
        """One tenant."""
        async with transaction(kiln, actor) as session:
            return await services.read_tenant(session, actor, tenant_id)

    @patch("/tenants/{tenant_id:uuid}")
    async def update_tenant(
        self, kiln: KilnDep, actor: ActorDep, tenant_id: uuid.UUID, data: TenantUpdate
    ) -> TenantView:
        """Rename a tenant or change its fair-share weight (platform-admin)."""
        async with transaction(kiln, actor) as session:
            return await services.update_tenant(session, actor, tenant_id, data)

    @delete("/tenants/{tenant_id:uuid}")
    async def delete_tenant(self, kiln: KilnDep, actor: ActorDep, tenant_id: uuid.UUID) -> None:
        """Delete a tenant without metered usage (platform-admin)."""
        async with transaction(kiln, actor) as session:
            await services.delete_tenant(session, actor, tenant_id)

    @get("/tenants/{tenant_id:uuid}/keys", opt=KEYS)
    async def list_keys(
        self, kiln: KilnDep, actor: ActorDep, tenant_id: uuid.UUID
    ) -> list[KeyView]:
        """A tenant's API keys (prefix, label, role, scopes, created, last used, expiry)."""
        async with transaction(kiln, actor) as session:
            return await services.list_keys(session, actor, tenant_id)

    @post("/tenants/{tenant_id:uuid}/keys", status_code=201, opt=KEYS)
    async def create_key(
        self, kiln: KilnDep, actor: ActorDep, tenant_id: uuid.UUID, data: KeyCreate
    ) -> KeyCreated:
        """Create an API key; its secret is in this response only."""
        async with transaction(kiln, actor) as session:
            return await services.create_tenant_key(
                session, actor, tenant_id, data, kiln.settings.hmac_key()
            )

    @delete("/tenants/{tenant_id:uuid}/keys/{key_id:uuid}", status_code=200, opt=KEYS)
    async def revoke_key(
        self, kiln: KilnDep, actor: ActorDep, tenant_id: uuid.UUID, key_id: uuid.UUID
    ) -> KeyView:
        """Revoke an API key (refused by every gateway within the key cache TTL, 5 s)."""
        async with transaction(kiln, actor) as session:
            return await services.revoke_key(
                session, actor, str(key_id), kiln.settings.hmac_key(), tenant_id
            )
