"""Routing a model's traffic between its versions: a stable version, and optionally a canary
that serves a share of tenants, chosen by a sticky hash so each tenant sees one version.

Rollback is setting the route back (``canary_percent`` 0, or the old version as stable);
promotion is making the canary stable. A model without a route serves its newest version.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert

from kiln_platform.admin.authz import Actor, require
from kiln_platform.audit.services import record
from kiln_platform.db.tables import Model, ModelRoute, ModelVersion
from kiln_platform.errors import BadRequest, ModelNotFound
from kiln_platform.registry.schemas import RouteUpdate, RouteView

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

_BUCKETS = 10_000


@dataclass(frozen=True, slots=True)
class Route:
    """Which versions serve, and the canary's share (percent of sticky keys)."""

    stable: str
    canary: str | None = None
    canary_percent: int = 0

    @property
    def versions(self) -> tuple[str, ...]:
        """The versions that need a pool."""
        return (self.stable,) if self.canary is None else (self.stable, self.canary)

    def choose(self, model: str, sticky: str) -> str:
        """The version for ``sticky`` (a tenant id): the same one every time for a given route."""
        if self.canary is None or self.canary_percent <= 0:
            return self.stable
        digest = hashlib.sha256(f"{model}\0{sticky}".encode()).digest()
        bucket = int.from_bytes(digest[:8], "big") % _BUCKETS
        return self.canary if bucket < self.canary_percent * _BUCKETS // 100 else self.stable


async def get_route(session: AsyncSession, actor: Actor, name: str) -> RouteView:
    """A model's route; a model without one serves its newest version."""
    require(actor, "models")
    model = await _model(session, name)
    row = await session.get(ModelRoute, model.id)
    if row is not None:
        return _view(name, row)
    newest = await session.scalar(
        select(ModelVersion.version)
        .where(ModelVersion.model_id == model.id)
        .order_by(ModelVersion.created_at.desc())
        .limit(1)
    )
    return RouteView(model=name, stable_version=str(newest), routed=False)


async def set_route(session: AsyncSession, actor: Actor, name: str, data: RouteUpdate) -> RouteView:
    """Set a model's route (platform-admin); versions must exist, the canary differ from stable."""
    require(actor, "models", write=True)  # the catalog is not a tenant's: no existence to hide
    model = await _model(session, name)
    versions = set(
        await session.scalars(select(ModelVersion.version).where(ModelVersion.model_id == model.id))
    )
    for field, version in (("stable_version", data.stable_version),
                           ("canary_version", data.canary_version)):  # fmt: skip
        if version is not None and version not in versions:
            raise BadRequest(f"`{name}` has no version `{version}`.", param=field)
    if data.canary_version == data.stable_version:
        raise BadRequest("The canary must be another version than the stable one.",
                         param="canary_version")  # fmt: skip
    if data.canary_percent and data.canary_version is None:
        raise BadRequest("A canary share needs a canary_version.", param="canary_percent")
    before = await session.get(ModelRoute, model.id)
    values = _values(data)
    await session.execute(
        insert(ModelRoute).values(model_id=model.id, **values)
        .on_conflict_do_update(index_elements=["model_id"], set_=values)
    )  # fmt: skip
    await record(session, actor, "model.route", "model", model.id, None,
                 before=None if before is None else _values(before), after=values)  # fmt: skip
    return _view(name, data)


async def _model(session: AsyncSession, name: str) -> Model:
    model = await session.scalar(select(Model).where(Model.name == name))
    if model is None:
        raise ModelNotFound(f"The model `{name}` does not exist.", param="name")
    return model


def _view(name: str, route: ModelRoute | RouteUpdate) -> RouteView:
    return RouteView(
        model=name, stable_version=route.stable_version, canary_version=route.canary_version,
        canary_percent=route.canary_percent,
    )  # fmt: skip


def _values(route: ModelRoute | RouteUpdate) -> dict[str, object]:
    """A route's columns (and its audit snapshot)."""
    return {"stable_version": route.stable_version, "canary_version": route.canary_version,
            "canary_percent": route.canary_percent}  # fmt: skip


ModelRoutes = tuple[RouteView, list[str]]
"""A model's route, and its versions oldest first."""


async def list_routes(session: AsyncSession, actor: Actor) -> list[ModelRoutes]:
    """Every model's route and versions, by model name (one query)."""
    require(actor, "models")
    rows = await session.execute(
        select(Model.name, ModelVersion.version, ModelRoute)
        .join(ModelVersion, ModelVersion.model_id == Model.id)
        .outerjoin(ModelRoute, ModelRoute.model_id == Model.id)
        .order_by(Model.name, ModelVersion.created_at)
    )
    found: dict[str, tuple[ModelRoute | None, list[str]]] = {}
    for name, version, route in rows.all():
        found.setdefault(name, (route, []))[1].append(version)
    return [
        (_view(name, route) if route else RouteView(model=name, stable_version=versions[-1],
                                                     routed=False), versions)
        for name, (route, versions) in found.items()
    ]  # fmt: skip
