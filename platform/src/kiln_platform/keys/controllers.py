"""`/admin/v1/tenants/{id}/keys`: thin handlers, behaviour in ``keys.services``."""

from __future__ import annotations

import uuid
from typing import Annotated

from litestar import delete, get, post
from litestar.params import Parameter

from kiln_platform.admin.deps import AdminController, CallDep
from kiln_platform.keys import services
from kiln_platform.keys.schemas import KeyCreate, KeyCreated, KeyRotate, KeyRotated, KeyView


class KeysController(AdminController):
    """A tenant's API keys."""

    opt = {"resource": "keys"}  # noqa: RUF012 (admin.deps.authorize reads it)

    @get("/tenants/{tenant_id:uuid}/keys")
    async def list_keys(
        self, call: CallDep, tenant_id: uuid.UUID, revoked: bool = False,
        limit: Annotated[int, Parameter(ge=1, le=services.MAX_PAGE)] = services.MAX_PAGE,
        before: uuid.UUID | None = None,
    ) -> list[KeyView]:  # fmt: skip
        """A tenant's API keys (prefix, label, role, scopes, created, last used, expiry), newest
        first: at most ``limit``, older than key ``before`` (the next page: the last key's id),
        revoked ones only with ``revoked=true``."""
        session = await call.session()
        return await services.list_keys(
            session, call.actor, tenant_id, revoked=revoked, limit=limit, before=before
        )

    @post("/tenants/{tenant_id:uuid}/keys", status_code=201)
    async def create_key(self, call: CallDep, tenant_id: uuid.UUID, data: KeyCreate) -> KeyCreated:
        """Create an API key; its secret is in this response only."""
        session = await call.session()
        return await services.create_key(session, call.actor, tenant_id, data, call.hmac_key)

    @delete("/tenants/{tenant_id:uuid}/keys/{key_id:uuid}", status_code=200)
    async def revoke_key(self, call: CallDep, tenant_id: uuid.UUID, key_id: uuid.UUID) -> KeyView:
        """Revoke an API key (refused by this gateway at once, by every other within the key
        cache TTL, 5 s)."""
        session = await call.session()
        return await services.revoke_key(
            session, call.actor, str(key_id), call.hmac_key, tenant_id, verifier=call.kiln.keys
        )

    @post("/tenants/{tenant_id:uuid}/keys/{key_id:uuid}/rotate", status_code=201)
    async def rotate_key(
        self, call: CallDep, tenant_id: uuid.UUID, key_id: uuid.UUID, data: KeyRotate
    ) -> KeyRotated:
        """Replace a key: a new key now, the old one expiring after ``overlap_s`` (default 24 h)."""
        session = await call.session()
        return await services.rotate_key(
            session, call.actor, tenant_id, key_id, overlap_s=data.overlap_s,
            hmac_key=call.hmac_key, verifier=call.kiln.keys,
        )  # fmt: skip
