"""One model version as operators see it (engine settings, accuracy report), and changing its
engine settings; the pool manager restarts the version's workers with the new ones."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

import msgspec
from sqlalchemy import select

from kiln_platform.admin.authz import require
from kiln_platform.audit.services import record
from kiln_platform.db.tables import Model, ModelVersion
from kiln_platform.errors import BadRequest, NotFound
from kiln_platform.registry.engine import (
    EngineSettings,
    EngineUpdate,
    check_bounds,
    decode,
    merged,
)

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
        manifest=row.manifest, created_at=row.created_at,
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
