"""The model catalog: registering versions, reading and setting routes, and resolving a
request's model to the version that serves it."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import msgspec
from sqlalchemy import select
from sqlalchemy.dialects.postgresql import distinct_on, insert

from kiln_platform.admin.authz import Actor, require
from kiln_platform.audit.services import record
from kiln_platform.db import after_commit
from kiln_platform.db.tables import Model, ModelRoute, ModelVersion
from kiln_platform.errors import BadRequest, Conflict, ModelNotFound
from kiln_platform.registry.engine import EngineSettings, decode
from kiln_platform.registry.lifecycle import DEFAULT_SERVING, check_target
from kiln_platform.registry.schemas import RouteUpdate, RouteView
from kiln_platform.registry.tables import ModelRollout
from kiln_runtimes.protocol import ModelManifest

if TYPE_CHECKING:
    import uuid
    from collections.abc import Awaitable, Callable

    from sqlalchemy.ext.asyncio import AsyncSession


@dataclass(frozen=True, slots=True)
class ResolvedVersion:
    """A model version as the gateway and the pool manager see it."""

    model: str
    version: str
    artifact_digest: str
    manifest: ModelManifest
    created_at: datetime
    engine: EngineSettings = field(default_factory=EngineSettings)
    """The version's own engine settings (unset fields: the deployment's defaults)."""
    state: str = "active"
    """``registry.lifecycle.State``."""
    deprecated_at: datetime | None = None
    sunset: datetime | None = None
    successor: str | None = None

    @property
    def context_length(self) -> int:
        """Tokens a request may use: the model's context, capped by ``max_context``."""
        cap = self.engine.max_context
        return min(self.manifest.context_length, cap) if cap else self.manifest.context_length

    @property
    def pool(self) -> str:
        """The pool that serves this version: ``model@version``."""
        return f"{self.model}@{self.version}"


def resolved(model: Model, row: ModelVersion) -> ResolvedVersion:
    manifest = msgspec.convert(row.manifest, ModelManifest)
    return ResolvedVersion(
        model.name, row.version, row.artifact_digest, manifest, row.created_at,
        decode(row.engine_settings), row.state, row.deprecated_at, row.sunset, row.successor,
    )  # fmt: skip


async def register_version(
    session: AsyncSession,
    manifest: ModelManifest,
    version: str,
    artifact_digest: str,
    *,
    engine: EngineSettings | None = None,
    accuracy: object = None,
    source_digest: str | None = None,
    imported_by: str | None = None,
) -> bool:
    """Register ``manifest.name`` at ``version``; returns False if that version already exists.

    Imported versions also carry their engine settings, the build's accuracy report and the
    source tree they were built from; ``imported_by`` is the actor that uploaded it."""
    await session.execute(
        insert(Model).values(name=manifest.name, task=manifest.task).on_conflict_do_nothing()
    )
    model_id = await session.scalar(select(Model.id).where(Model.name == manifest.name))
    result = await session.execute(
        insert(ModelVersion)
        .values(
            model_id=model_id,
            version=version,
            artifact_digest=artifact_digest,
            manifest=msgspec.to_builtins(manifest),
            engine_settings=msgspec.to_builtins(engine or EngineSettings()),
            accuracy=msgspec.to_builtins(accuracy),
            source_digest=source_digest,
            imported_by=imported_by,
        )
        .on_conflict_do_nothing()
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]  # a CursorResult


async def latest_versions(session: AsyncSession) -> list[ResolvedVersion]:
    """The newest version of every model, by name."""
    rows = await session.execute(
        select(Model, ModelVersion)
        .join(ModelVersion, ModelVersion.model_id == Model.id)
        .ext(distinct_on(Model.name))
        .order_by(Model.name, ModelVersion.created_at.desc())
    )
    return [resolved(model, version) for model, version in rows.all()]


async def default_version(
    session: AsyncSession, model_id: uuid.UUID, but: str | None = None
) -> str | None:
    """What a model without a route serves: its newest active or deprecated version (``but``:
    leaving that one out), or None."""
    query = select(ModelVersion.version).where(
        ModelVersion.model_id == model_id, ModelVersion.state.in_(DEFAULT_SERVING)
    )
    if but is not None:
        query = query.where(ModelVersion.version != but)
    return await session.scalar(query.order_by(ModelVersion.created_at.desc()).limit(1))


async def get_route(session: AsyncSession, actor: Actor, name: str) -> RouteView:
    """A model's route; a model without one serves its newest active or deprecated version."""
    require(actor, "models")
    model = await find_model(session, name)
    row = await session.get(ModelRoute, model.id)
    if row is not None:
        return _view(name, row)
    default = await default_version(session, model.id)
    return RouteView(model=name, stable_version=default or "", routed=False)


async def set_route(
    session: AsyncSession, actor: Actor, name: str, data: RouteUpdate,
    *, reconcile: Callable[[], Awaitable[object]] | None = None,
) -> RouteView:  # fmt: skip
    """Set a model's route (platform-admin); versions must exist, the canary differ from stable.

    ``reconcile``: the pool manager's, run once the route is committed (pools for the new
    route at once on this gateway; others within their 2 s refresh)."""
    require(actor, "models", write=True)  # the catalog is not a tenant's: no existence to hide
    model = await find_model(session, name)
    for param, version in (("stable_version", data.stable_version),
                           ("canary_version", data.canary_version)):  # fmt: skip
        if version is not None:
            await version_state(session, model, version, param)
    if data.canary_version == data.stable_version:
        raise BadRequest("The canary must be another version than the stable one.",
                         param="canary_version")  # fmt: skip
    if data.canary_percent and data.canary_version is None:
        raise BadRequest("A canary share needs a canary_version.", param="canary_percent")
    if await running(session, model.id) is not None:
        raise Conflict(f"A rollout of `{name}` owns its route; DELETE the rollout first.")
    before = await session.get(ModelRoute, model.id)
    values = _values(data)
    await write_route(session, model.id, data.stable_version, data.canary_version,
                      data.canary_percent, "tenant")  # fmt: skip
    await record(session, actor, "model.route", "model", model.id, None,
                 before=None if before is None else _values(before), after=values)  # fmt: skip
    if reconcile is not None:
        after_commit.defer(session, reconcile)
    return _view(name, data)


async def running(
    session: AsyncSession, model_id: uuid.UUID, *, lock: bool = False
) -> ModelRollout | None:
    """The model's running rollout, if any (``lock``: for update)."""
    query = select(ModelRollout).where(
        ModelRollout.model_id == model_id, ModelRollout.state == "running"
    )
    return await session.scalar(query.with_for_update() if lock else query)


async def write_route(  # noqa: PLR0917 (a route's whole content)
    session: AsyncSession, model_id: uuid.UUID, stable: str, canary: str | None, share: int,
    split: str,
) -> None:  # fmt: skip
    """Write the model's route (set by hand, or moved by a rollout's steps)."""
    values = {"stable_version": stable, "canary_version": canary, "canary_percent": share,
              "canary_split": split, "updated_at": datetime.now(UTC)}  # fmt: skip
    await session.execute(
        insert(ModelRoute).values(model_id=model_id, **values)
        .on_conflict_do_update(index_elements=["model_id"], set_=values)
    )  # fmt: skip


async def find_model(session: AsyncSession, name: str) -> Model:
    model = await session.scalar(select(Model).where(Model.name == name))
    if model is None:
        raise ModelNotFound(f"The model `{name}` does not exist.", param="name")
    return model


async def version_state(session: AsyncSession, model: Model, version: str, param: str) -> str:
    """The state of a version a route, alias or pin is to name: 400 naming ``param`` if it does
    not exist or is retired."""
    state = await session.scalar(
        select(ModelVersion.state).where(
            ModelVersion.model_id == model.id, ModelVersion.version == version
        )
    )
    if state is None:
        raise BadRequest(f"`{model.name}` has no version `{version}`.", param=param)
    check_target(state, version, param)
    return state


def _view(name: str, route: ModelRoute | RouteUpdate) -> RouteView:
    return RouteView(
        model=name, stable_version=route.stable_version, canary_version=route.canary_version,
        canary_percent=route.canary_percent,
    )  # fmt: skip


def _values(route: ModelRoute | RouteUpdate) -> dict[str, object]:
    """A route's columns (and its audit snapshot)."""
    return {"stable_version": route.stable_version, "canary_version": route.canary_version,
            "canary_percent": route.canary_percent,
            "canary_split": getattr(route, "canary_split", "tenant")}  # fmt: skip


ModelRoutes = tuple[RouteView, list[str]]
"""A model's route, and its versions oldest first."""


async def list_routes(session: AsyncSession, actor: Actor) -> list[ModelRoutes]:
    """Every model's route and versions, by model name (one query)."""
    require(actor, "models")
    rows = await session.execute(
        select(Model.name, ModelVersion.version, ModelVersion.state, ModelRoute)
        .join(ModelVersion, ModelVersion.model_id == Model.id)
        .outerjoin(ModelRoute, ModelRoute.model_id == Model.id)
        .order_by(Model.name, ModelVersion.created_at)
    )
    found: dict[str, tuple[ModelRoute | None, list[str]]] = {}
    defaults: dict[str, str] = {}  # oldest first: the last one kept is the newest
    for name, version, state, route in rows.all():
        found.setdefault(name, (route, []))[1].append(version)
        if state in DEFAULT_SERVING:
            defaults[name] = version
    return [
        (_view(name, route) if route else RouteView(
            model=name, stable_version=defaults.get(name, ""), routed=False), versions)
        for name, (route, versions) in found.items()
    ]  # fmt: skip


async def model_names(session: AsyncSession, task: str) -> list[str]:
    """The names of the models of a task (``generate``: those adapters may extend), sorted."""
    return sorted(await session.scalars(select(Model.name).where(Model.task == task)))
