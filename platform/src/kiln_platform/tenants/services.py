"""Tenants: create, read, change, delete; every query is scoped by the actor."""

from __future__ import annotations

import uuid
import zoneinfo
from typing import TYPE_CHECKING

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError

from kiln_platform.admin.authz import Actor, check_tenant, require
from kiln_platform.audit.services import record, snapshot
from kiln_platform.db.tables import Tenant, UsageEvent
from kiln_platform.errors import BadRequest, Conflict, NotFound
from kiln_platform.tenants.schemas import TenantCreate, TenantUpdate, TenantView

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

FIELDS = ("id", "name", "weight", "plan", "timezone")


async def insert_tenant(session: AsyncSession, name: str, weight: float = 1.0) -> Tenant:
    """Insert a tenant with a unique name and a fair-share weight (no actor, no audit: for
    ``create_tenant`` and for seeding tests)."""
    name = name.strip()
    if not name or len(name) > 100:
        raise BadRequest("tenant name must be 1 to 100 characters", param="name")
    if not 0 < weight <= 1000:
        raise BadRequest("tenant weight must be in (0, 1000]", param="weight")
    tenant = Tenant(name=name, weight=weight)
    session.add(tenant)
    try:
        await session.flush()
    except IntegrityError as exc:
        raise Conflict(f"tenant {name!r} already exists", param="name") from exc
    return tenant


async def tenant_id_of(session: AsyncSession, name: str) -> uuid.UUID:
    """A tenant's id from its name (the CLI names tenants)."""
    tenant = await session.scalar(select(Tenant).where(Tenant.name == name))
    if tenant is None:
        raise NotFound(f"no tenant named {name!r}", param="tenant")
    return tenant.id


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
    tenant = await insert_tenant(session, data.name, data.weight)
    await record(session, actor, "tenant.create", "tenant", tenant.id, tenant.id,
                 after=snapshot(tenant, *FIELDS))  # fmt: skip
    return tenant_view(tenant)


async def update_tenant(
    session: AsyncSession, actor: Actor, tenant_id: uuid.UUID, data: TenantUpdate
) -> TenantView:
    """Rename a tenant or change its weight, plan or time zone (platform-admin)."""
    tenant = await get_tenant(session, actor, tenant_id)
    require(actor, "tenants", write=True)
    before = snapshot(tenant, *FIELDS)
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
                 before=before, after=snapshot(tenant, *FIELDS))  # fmt: skip
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
    before = snapshot(tenant, *FIELDS)
    await session.delete(tenant)
    await session.flush()
    await record(session, actor, "tenant.delete", "tenant", tenant_id, tenant_id, before=before)


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
