"""Per-model aliases (``model@prod``): set or moved atomically (one row), removed, listed.

Platform-admin only and audited (``model.alias``). Gateways read them from the Resolver's
in-memory catalog: this one at once after the commit, others within their 2 s refresh.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec
from sqlalchemy import delete, select
from sqlalchemy.dialects.postgresql import insert

from kiln_platform.admin.authz import require
from kiln_platform.audit.services import record
from kiln_platform.db import after_commit
from kiln_platform.db.tables import ModelAlias, ModelVersion
from kiln_platform.errors import BadRequest
from kiln_platform.registry.lifecycle import ROUTE_ALIASES
from kiln_platform.registry.schemas import AliasName, AliasView
from kiln_platform.registry.services import find_model, version_state

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from sqlalchemy.ext.asyncio import AsyncSession

    from kiln_platform.admin.authz import Actor


async def list_aliases(session: AsyncSession, actor: Actor, name: str) -> list[AliasView]:
    """A model's aliases, by name."""
    require(actor, "models")
    model = await find_model(session, name)
    rows = await session.scalars(
        select(ModelAlias).where(ModelAlias.model_id == model.id).order_by(ModelAlias.alias)
    )
    return [AliasView(model=name, alias=r.alias, version=r.version) for r in rows]


async def set_alias(
    session: AsyncSession, actor: Actor, name: str, alias: str, version: str,
    *, reconcile: Callable[[], Awaitable[object]] | None = None,
) -> AliasView:  # fmt: skip
    """Point ``name@alias`` at ``version`` (created or moved in one statement)."""
    require(actor, "models", write=True)
    try:
        msgspec.convert(alias, AliasName)
    except msgspec.ValidationError:
        raise BadRequest(f"`{alias}` is not a valid alias name.", param="alias") from None
    model = await find_model(session, name)
    if alias in ROUTE_ALIASES or await _is_version(session, model.id, alias):
        raise BadRequest(f"`{alias}` is a version or a route's name, not an alias.", param="alias")
    await version_state(session, model, version, "version")
    before = await session.get(ModelAlias, (model.id, alias))
    was = None if before is None else before.version
    await session.execute(
        insert(ModelAlias).values(model_id=model.id, alias=alias, version=version)
        .on_conflict_do_update(index_elements=["model_id", "alias"], set_={"version": version})
    )  # fmt: skip
    await record(session, actor, "model.alias", "model", model.id, None,
                 before=None if was is None else {"alias": alias, "version": was},
                 after={"alias": alias, "version": version})  # fmt: skip
    if reconcile is not None:
        after_commit.defer(session, reconcile)
    return AliasView(model=name, alias=alias, version=version)


async def delete_alias(
    session: AsyncSession, actor: Actor, name: str, alias: str,
    *, reconcile: Callable[[], Awaitable[object]] | None = None,
) -> None:  # fmt: skip
    """Remove ``name@alias`` (requests naming it then get 404); an absent alias is left so."""
    require(actor, "models", write=True)
    model = await find_model(session, name)
    row = await session.get(ModelAlias, (model.id, alias))
    if row is None:
        return
    await session.execute(
        delete(ModelAlias).where(ModelAlias.model_id == model.id, ModelAlias.alias == alias)
    )
    await record(session, actor, "model.alias.delete", "model", model.id, None,
                 before={"alias": alias, "version": row.version})  # fmt: skip
    if reconcile is not None:
        after_commit.defer(session, reconcile)


async def _is_version(session: AsyncSession, model_id: object, name: str) -> bool:
    found = await session.scalar(
        select(ModelVersion.id).where(
            ModelVersion.model_id == model_id, ModelVersion.version == name
        )
    )
    return found is not None
