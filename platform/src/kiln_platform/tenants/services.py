"""Tenant behaviour."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from kiln_platform.db.tables import Tenant
from kiln_platform.errors import BadRequest, Conflict, NotFound

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession


async def create_tenant(session: AsyncSession, name: str, weight: float = 1.0) -> Tenant:
    """Create a tenant with a unique name and a fair-share weight."""
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


async def get_tenant_by_name(session: AsyncSession, name: str) -> Tenant:
    """Look a tenant up by name."""
    tenant = await session.scalar(select(Tenant).where(Tenant.name == name))
    if tenant is None:
        raise NotFound(f"no tenant named {name!r}", param="tenant")
    return tenant
