"""One model version as operators see it (engine settings, accuracy report), and changing its
engine settings; the pool manager restarts the version's workers with the new ones."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import msgspec
from sqlalchemy import select

from kiln_platform.admin.authz import require
from kiln_platform.audit.services import record
from kiln_platform.db.tables import Model, ModelAlias, ModelPin, ModelRoute, ModelVersion
from kiln_platform.errors import BadRequest, NotFound
from kiln_platform.registry.engine import (
    EngineSettings,
    EngineUpdate,
    check_bounds,
    decode,
    merged,
)
from kiln_platform.registry.lifecycle import STATES, State

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

    from kiln_platform.admin.authz import Actor


class VersionView(msgspec.Struct, kw_only=True):
    """``GET /admin/v1/models/{name}/versions/{version}``."""

    model: str
    version: str
    task: str
    artifact_digest: str
    source_digest: str | None
    engine_settings: EngineSettings
    accuracy: dict[str, Any] | None
    """The build's report: greedy and teacher-forced agreement with transformers
    (``generate``), cosines to sentence-transformers (``embeddings``), or why it was skipped."""
    manifest: dict[str, Any]
    created_at: datetime
    state: str = "active"
    """``staging``, ``active``, ``deprecated`` (answers with Deprecation/Sunset) or ``retired``."""
    deprecated_at: datetime | None = None
    sunset: datetime | None = None
    successor: str | None = None
    parent_version: str | None = None
    imported_by: str | None = None
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)
    """Free-form lineage: training data, eval results."""


class VersionUpdate(EngineUpdate, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``PATCH .../versions/{v}``: engine settings, lifecycle and lineage to change."""

    state: State | msgspec.UnsetType = msgspec.UNSET
    sunset: datetime | msgspec.UnsetType | None = msgspec.UNSET
    successor: str | msgspec.UnsetType | None = msgspec.UNSET
    parent_version: str | msgspec.UnsetType | None = msgspec.UNSET
    metadata: dict[str, Any] | msgspec.UnsetType = msgspec.UNSET

    def engine(self) -> EngineUpdate:
        """The engine settings part."""
        return EngineUpdate(**{f: getattr(self, f) for f in EngineUpdate.__struct_fields__})


async def find_version(
    session: AsyncSession, name: str, version: str
) -> tuple[Model, ModelVersion]:
    """A model and one of its versions, or ``NotFound``."""
    row = (
        await session.execute(
            select(Model, ModelVersion)
            .join(ModelVersion, ModelVersion.model_id == Model.id)
            .where(Model.name == name, ModelVersion.version == version)
        )
    ).first()
    if row is None:
        raise NotFound(f"{name} version {version} does not exist")
    return row[0], row[1]


def _view(model: Model, row: ModelVersion) -> VersionView:
    return VersionView(
        model=model.name, version=row.version, task=model.task,
        artifact_digest=row.artifact_digest, source_digest=row.source_digest,
        engine_settings=decode(row.engine_settings),
        accuracy=row.accuracy,
        manifest=row.manifest, created_at=row.created_at, state=row.state,
        deprecated_at=row.deprecated_at, sunset=row.sunset, successor=row.successor,
        parent_version=row.parent_version, imported_by=row.imported_by, metadata=row.extra,
    )  # fmt: skip


async def view(session: AsyncSession, actor: Actor, name: str, version: str) -> VersionView:
    """One version (platform-admin), or ``NotFound``."""
    require(actor, "models")
    return _view(*await find_version(session, name, version))


async def update_engine(
    session: AsyncSession, actor: Actor, name: str, version: str, change: EngineUpdate
) -> VersionView:
    """Change a version's engine settings (platform-admin; audited as
    ``model.version.update``). A built model's target and precision are what it was built for."""
    require(actor, "models", write=True)
    model, row = await find_version(session, name, version)
    before = decode(row.engine_settings)
    after = merged(before, change)
    if model.task != "tensor":
        for key in ("target", "precision"):
            if getattr(after, key) != getattr(before, key):
                raise BadRequest(
                    f"{key} is what {name} {version} was built for: import it again to change it",
                    param=key,
                )
    try:
        check_bounds(after)
    except ValueError as error:
        raise BadRequest(str(error), param="min_replicas") from None
    row.engine_settings = msgspec.to_builtins(after)
    await session.flush()
    await record(session, actor, "model.version.update", "model", model.id, None,
                 before={"version": version, **msgspec.to_builtins(before)},
                 after={"version": version, **msgspec.to_builtins(after)})  # fmt: skip
    return _view(model, row)


async def accuracy_reports(session: AsyncSession, actor: Actor) -> dict[str, dict[str, Any]]:
    """Every imported version's accuracy report, keyed ``model@version`` (the console's rows)."""
    require(actor, "models")
    rows = await session.execute(
        select(Model.name, ModelVersion.version, ModelVersion.accuracy)
        .join(ModelVersion, ModelVersion.model_id == Model.id)
        .where(ModelVersion.accuracy.is_not(None))
    )
    return {f"{name}@{version}": dict(report) for name, version, report in rows.all() if report}


async def engine_settings(session: AsyncSession, actor: Actor) -> dict[str, EngineSettings]:
    """Every version's engine settings, keyed ``model@version`` (the console's forms)."""
    require(actor, "models")
    rows = await session.execute(
        select(Model.name, ModelVersion.version, ModelVersion.engine_settings).join(
            ModelVersion, ModelVersion.model_id == Model.id
        )
    )
    return {f"{name}@{version}": decode(value) for name, version, value in rows.all()}


_LIFECYCLE = ("state", "sunset", "successor", "parent_version", "metadata")


async def update_version(
    session: AsyncSession, actor: Actor, name: str, version: str, change: VersionUpdate
) -> VersionView:
    """Change a version's engine settings, lifecycle or lineage (platform-admin; audited)."""
    changed = {f: getattr(change, f) for f in _LIFECYCLE if getattr(change, f) is not msgspec.UNSET}
    if changed:
        await _update_lifecycle(session, actor, name, version, change)
    engine = change.engine()
    if any(getattr(engine, f) is not msgspec.UNSET for f in engine.__struct_fields__):
        return await update_engine(session, actor, name, version, engine)
    return await view(session, actor, name, version)


async def _update_lifecycle(
    session: AsyncSession, actor: Actor, name: str, version: str, change: VersionUpdate
) -> None:
    """States only move forward: staging -> active -> deprecated -> retired."""
    require(actor, "models", write=True)
    model, row = await find_version(session, name, version)
    before = {"version": version, "state": row.state, "successor": row.successor}
    if change.state is not msgspec.UNSET and change.state != row.state:
        if STATES.index(change.state) < STATES.index(row.state):
            raise BadRequest(f"{name} {version} is {row.state}: states only move forward",
                             param="state")  # fmt: skip
        if change.state == "retired":
            await _refuse_if_routed(session, model, version)
        if change.state == "deprecated":
            row.deprecated_at = datetime.now(UTC)
        row.state = change.state
    if change.successor is not msgspec.UNSET:
        if change.successor is not None:
            _, target = await find_version(session, name, change.successor)
            if target.state == "retired" or change.successor == version:
                raise BadRequest("The successor must be another, live version.", param="successor")
        row.successor = change.successor
    if change.sunset is not msgspec.UNSET:
        row.sunset = change.sunset
    if change.parent_version is not msgspec.UNSET:
        row.parent_version = change.parent_version
    if change.metadata is not msgspec.UNSET:
        row.extra = change.metadata
    await session.flush()
    await record(session, actor, "model.version.lifecycle", "model", model.id, None, before=before,
                 after={"version": version, "state": row.state, "successor": row.successor,
                        "sunset": row.sunset.isoformat() if row.sunset else None})  # fmt: skip


async def _refuse_if_routed(session: AsyncSession, model: Model, version: str) -> None:
    """A version a route or an alias names cannot retire: move them first."""
    route = await session.get(ModelRoute, model.id)
    aliased = await session.scalar(
        select(ModelAlias.alias).where(
            ModelAlias.model_id == model.id, ModelAlias.version == version
        )
    )
    pinned = await session.scalar(
        select(ModelPin.tenant_id).where(ModelPin.model_id == model.id, ModelPin.target == version)
    )
    if (route and version in (route.stable_version, route.canary_version)) or aliased or pinned:
        raise BadRequest(f"{model.name} {version} is still routed to: move its route, aliases "
                         "and pins first", param="state")  # fmt: skip


class ReleaseRow(msgspec.Struct, kw_only=True):
    """A version's lifecycle and the aliases naming it (the console's models table)."""

    state: str
    sunset: datetime | None
    successor: str | None
    aliases: list[str]


async def releases(session: AsyncSession, actor: Actor) -> dict[str, ReleaseRow]:
    """Every version's lifecycle and aliases, keyed ``model@version``."""
    require(actor, "models")
    named: dict[str, list[str]] = {}
    for name, alias, target in await session.execute(
        select(Model.name, ModelAlias.alias, ModelAlias.version)
        .join(ModelAlias, ModelAlias.model_id == Model.id)
        .order_by(ModelAlias.alias)
    ):
        named.setdefault(f"{name}@{target}", []).append(alias)
    rows = await session.execute(
        select(Model.name, ModelVersion).join(ModelVersion, ModelVersion.model_id == Model.id)
    )
    return {
        f"{name}@{v.version}": ReleaseRow(
            state=v.state,
            sunset=v.sunset,
            successor=v.successor,
            aliases=named.get(f"{name}@{v.version}", []),
        )
        for name, v in rows.all()
    }
