"""`/admin/v1/tenants/{id}/oauth-clients`: thin handlers, behaviour in ``oauth.services``."""

from __future__ import annotations

import uuid

from litestar import delete, get, post

from kiln_platform.admin.deps import AdminController, CallDep
from kiln_platform.oauth import services
from kiln_platform.oauth.schemas import ClientCreate, ClientCreated, ClientView


class ClientsController(AdminController):
    """A tenant's OAuth clients (client credentials grant)."""

    opt = {"resource": "oauth-clients"}  # noqa: RUF012 (admin.deps.authorize reads it)

    @get("/tenants/{tenant_id:uuid}/oauth-clients")
    async def list_clients(self, call: CallDep, tenant_id: uuid.UUID) -> list[ClientView]:
        """A tenant's OAuth clients (client id, label, scopes, created, revoked); never secrets."""
        return await services.list_clients(await call.session(), call.actor, tenant_id)

    @post("/tenants/{tenant_id:uuid}/oauth-clients", status_code=201)
    async def create_client(
        self, call: CallDep, tenant_id: uuid.UUID, data: ClientCreate
    ) -> ClientCreated:
        """Register a client; its secret is in this response only."""
        session = await call.session()
        return await services.create_client(session, call.actor, tenant_id, data, call.hmac_key)

    @delete("/tenants/{tenant_id:uuid}/oauth-clients/{client_id:uuid}", status_code=200)
    async def revoke_client(
        self, call: CallDep, tenant_id: uuid.UUID, client_id: uuid.UUID
    ) -> ClientView:
        """Revoke a client: no new tokens; its tokens are refused within the cache TTL (5 s)."""
        return await services.revoke_client(await call.session(), call.actor, tenant_id, client_id)
