"""An operator's pins: one tenant's plain ``model`` answers from a version or an alias (a
customer held back on a known-good version while the others move on).

Platform-admin only (resource ``model-pins``: the list spans tenants), audited as
``model.pin``; gateways read pins from the Resolver's in-memory catalog, and a pin whose target
resolves to nothing (no canary, a deleted alias) gives the tenant the route's choice."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import delete, select
from sqlalchemy.dialects.postgresql import insert

from kiln_platform.admin.authz import require
from kiln_platform.audit.services import record
from kiln_platform.db import after_commit
from kiln_platform.db.tables import ModelAlias, ModelPin, Tenant
from kiln_platform.errors import NotFound
from kiln_platform.registry.lifecycle import ROUTE_ALIASES
from kiln_platform.registry.schemas import PinView
from kiln_platform.registry.services import find_model, version_state

if TYPE_CHECKING:
    import uuid
    from collections.abc import Awaitable, Callable

    from sqlalchemy.ext.asyncio import AsyncSession

    from kiln_platform.admin.authz import Actor


async def list_pins(session: AsyncSession, actor: Actor, name: str) -> list[PinView]:
    """A model's pinned tenants."""
    require(actor, "model-pins")
    model = await find_model(session, name)
    rows = await session.scalars(select(ModelPin).where(ModelPin.model_id == model.id))
    return [PinView(model=name, tenant_id=r.tenant_id, target=r.target) for r in rows]


async def set_pin(
    session: AsyncSession, actor: Actor, name: str, tenant_id: uuid.UUID, target: str,
    *, reconcile: Callable[[], Awaitable[object]] | None = None,
) -> PinView:  # fmt: skip
    """Pin a tenant to ``target`` (a version, an alias, ``stable`` or ``canary``); a retired
    version is refused (400 naming ``target``)."""
    require(actor, "model-pins", write=True)
    model = await find_model(session, name)
    if await session.get(Tenant, tenant_id) is None:
        raise NotFound(f"tenant {tenant_id} does not exist")
    aliased = await session.get(ModelAlias, (model.id, target))
    if target not in ROUTE_ALIASES and aliased is None:
        await version_state(session, model, target, "target")
    before = await session.get(ModelPin, (model.id, tenant_id))
    was = None if before is None else {"tenant_id": str(tenant_id), "target": before.target}
    await session.execute(
        insert(ModelPin).values(model_id=model.id, tenant_id=tenant_id, target=target)
        .on_conflict_do_update(index_elements=["model_id", "tenant_id"], set_={"target": target})
    )  # fmt: skip
    await record(session, actor, "model.pin", "model", model.id, tenant_id, before=was,
                 after={"tenant_id": str(tenant_id), "target": target})  # fmt: skip
    if reconcile is not None:
        after_commit.defer(session, reconcile)
    return PinView(model=name, tenant_id=tenant_id, target=target)


async def delete_pin(
    session: AsyncSession, actor: Actor, name: str, tenant_id: uuid.UUID,
    *, reconcile: Callable[[], Awaitable[object]] | None = None,
) -> None:  # fmt: skip
    """Unpin a tenant (it follows the route again); an absent pin is left so."""
    require(actor, "model-pins", write=True)
    model = await find_model(session, name)
    row = await session.get(ModelPin, (model.id, tenant_id))
    if row is None:
        return
    await session.execute(
        delete(ModelPin).where(ModelPin.model_id == model.id, ModelPin.tenant_id == tenant_id)
    )
    await record(session, actor, "model.pin.delete", "model", model.id, tenant_id,
                 before={"tenant_id": str(tenant_id), "target": row.target})  # fmt: skip
    if reconcile is not None:
        after_commit.defer(session, reconcile)
