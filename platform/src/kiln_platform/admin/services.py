"""Tenants and API keys for the admin API and the CLI; every query is scoped by the actor."""

from __future__ import annotations

import uuid
import zoneinfo
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError

from kiln_platform.admin.authz import Actor, Role, check_tenant, grantable, require
from kiln_platform.admin.schemas import (
    KeyCreate,
    KeyCreated,
    KeyView,
    TenantCreate,
    TenantUpdate,
    TenantView,
)
from kiln_platform.audit.services import record, snapshot
from kiln_platform.db.tables import ApiKey, Tenant, UsageEvent
from kiln_platform.errors import BadRequest, Conflict, NotFound
from kiln_platform.keys.services import create_key, key_digest, split_prefix
from kiln_platform.tenants.services import create_tenant as _create_tenant

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

TENANT_FIELDS = ("id", "name", "weight", "plan", "timezone")
KEY_FIELDS = ("id", "prefix", "name", "role", "scopes", "expires_at", "revoked_at")


async def get_tenant(session: AsyncSession, actor: Actor, tenant_id: uuid.UUID) -> Tenant:
    """A tenant the actor may see (another tenant's is ``NotFound``, like a missing one).

    Services look objects up before they check the role, so another tenant's object is a 404
    whatever the caller's role: a 403 would confirm that it exists.
    """
    check_tenant(actor, tenant_id, "tenant")
    tenant = await session.get(Tenant, tenant_id)
    if tenant is None:
        raise NotFound("No such tenant.")
    return tenant


async def read_tenant(session: AsyncSession, actor: Actor, tenant_id: uuid.UUID) -> TenantView:
    """One tenant, for a role that may read tenants."""
    tenant = await get_tenant(session, actor, tenant_id)
    require(actor, "tenants")
    return tenant_view(tenant)


async def list_tenants(session: AsyncSession, actor: Actor) -> list[TenantView]:
    """Tenants visible to the actor, by name."""
    require(actor, "tenants")
    query = select(Tenant).order_by(Tenant.name)
    if actor.tenant_id is not None:
        query = query.where(Tenant.id == actor.tenant_id)
    return [tenant_view(t) for t in await session.scalars(query)]


async def create_tenant(session: AsyncSession, actor: Actor, data: TenantCreate) -> TenantView:
    """Create a tenant (platform-admin)."""
    require(actor, "tenants", write=True)
    tenant = await _create_tenant(session, data.name, data.weight)
    await record(session, actor, "tenant.create", "tenant", tenant.id, tenant.id,
                 after=snapshot(tenant, *TENANT_FIELDS))  # fmt: skip
    return tenant_view(tenant)


async def update_tenant(
    session: AsyncSession, actor: Actor, tenant_id: uuid.UUID, data: TenantUpdate
) -> TenantView:
    """Rename a tenant or change its weight, plan or time zone (platform-admin)."""
    tenant = await get_tenant(session, actor, tenant_id)
    require(actor, "tenants", write=True)
    before = snapshot(tenant, *TENANT_FIELDS)
    if data.name is not None:
        tenant.name = data.name
    if data.weight is not None:
        tenant.weight = data.weight
    if data.plan is not None:
        tenant.plan = data.plan
    if data.timezone is not None:
        tenant.timezone = _zone(data.timezone)
    try:
        await session.flush()
    except IntegrityError as exc:
        raise Conflict(f"tenant {data.name!r} already exists", param="name") from exc
    await record(session, actor, "tenant.update", "tenant", tenant.id, tenant.id,
                 before=before, after=snapshot(tenant, *TENANT_FIELDS))  # fmt: skip
    return tenant_view(tenant)


async def delete_tenant(session: AsyncSession, actor: Actor, tenant_id: uuid.UUID) -> None:
    """Delete a tenant with its keys, users and clients; one with metered usage is kept."""
    tenant = await get_tenant(session, actor, tenant_id)
    require(actor, "tenants", write=True)
    used = await session.scalar(
        select(func.count()).select_from(UsageEvent).where(UsageEvent.tenant_id == tenant_id)
    )
    if used:
        raise Conflict("The tenant has metered usage; it cannot be deleted.")
    before = snapshot(tenant, *TENANT_FIELDS)
    await session.delete(tenant)
    await session.flush()
    await record(session, actor, "tenant.delete", "tenant", tenant_id, tenant_id, before=before)


async def list_keys(session: AsyncSession, actor: Actor, tenant_id: uuid.UUID) -> list[KeyView]:
    """A tenant's keys, newest first: prefix, label, role, scopes, dates; never secrets."""
    await get_tenant(session, actor, tenant_id)
    require(actor, "keys")
    rows = await session.scalars(
        select(ApiKey).where(ApiKey.tenant_id == tenant_id).order_by(ApiKey.created_at.desc())
    )
    return [key_view(k) for k in rows]


async def create_tenant_key(
    session: AsyncSession, actor: Actor, tenant_id: uuid.UUID, data: KeyCreate, hmac_key: bytes
) -> KeyCreated:
    """Create a key in a tenant; the secret is in the result only."""
    await get_tenant(session, actor, tenant_id)
    require(actor, "keys", write=True)
    if data.role is not None:
        grantable(actor, Role(data.role))
    expires = None
    if data.expires_in_s is not None:
        expires = datetime.now(UTC) + timedelta(seconds=data.expires_in_s)
    key, secret = await create_key(
        session, hmac_key, tenant_id, name=data.name, scopes=frozenset(data.scopes),
        expires_at=expires, role=data.role,
    )  # fmt: skip
    await record(session, actor, "key.create", "api_key", key.id, tenant_id,
                 after=snapshot(key, *KEY_FIELDS))  # fmt: skip
    return KeyCreated(key=key_view(key), secret=secret)


async def find_key(session: AsyncSession, actor: Actor, ref: str, hmac_key: bytes) -> ApiKey:
    """A key by id, displayed prefix or secret, if the actor may see it."""
    query = select(ApiKey)
    try:
        query = query.where(ApiKey.id == uuid.UUID(ref))
    except ValueError:
        prefix = split_prefix(ref)
        if prefix is not None:
            query = query.where(ApiKey.prefix == prefix, ApiKey.digest == key_digest(hmac_key, ref))
        else:
            query = query.where(ApiKey.prefix == ref)
    key = await session.scalar(query)
    if key is None:
        raise NotFound("No such API key.")
    check_tenant(actor, key.tenant_id, "API key")
    return key


async def revoke_key(
    session: AsyncSession, actor: Actor, ref: str, hmac_key: bytes, tenant_id: uuid.UUID | None
) -> KeyView:
    """Revoke a key (idempotent; one audit record per call that revokes)."""
    key = await find_key(session, actor, ref, hmac_key)
    if tenant_id is not None and key.tenant_id != tenant_id:
        raise NotFound("No such API key.")
    require(actor, "keys", write=True)
    if key.revoked_at is None:
        before = snapshot(key, *KEY_FIELDS)
        key.revoked_at = datetime.now(UTC)
        await session.flush()
        await record(session, actor, "key.revoke", "api_key", key.id, key.tenant_id,
                     before=before, after=snapshot(key, *KEY_FIELDS))  # fmt: skip
    return key_view(key)


def _zone(name: str) -> str:
    if name not in zoneinfo.available_timezones():
        raise BadRequest(
            f"'timezone' must be an IANA time zone such as 'Europe/Paris' (got {name!r}).",
            param="timezone",
        )
    return name


def tenant_view(t: Tenant) -> TenantView:
    """Wire form of a tenant."""
    return TenantView(id=t.id, name=t.name, weight=t.weight, created_at=t.created_at,
                      plan=t.plan, timezone=t.timezone)  # fmt: skip


def key_view(k: ApiKey) -> KeyView:
    """Wire form of a key."""
    return KeyView(
        id=k.id, tenant_id=k.tenant_id, prefix=k.prefix, name=k.name, role=k.role,
        scopes=list(k.scopes), created_at=k.created_at, last_used_at=k.last_used_at,
        expires_at=k.expires_at, revoked_at=k.revoked_at,
    )  # fmt: skip
