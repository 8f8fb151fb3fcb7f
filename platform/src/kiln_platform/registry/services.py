"""Registering and resolving model versions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec
from sqlalchemy import select
from sqlalchemy.dialects.postgresql import distinct_on, insert

from kiln_platform.db.tables import Model, ModelVersion
from kiln_platform.errors import ModelNotFound
from kiln_runtimes.protocol import ModelManifest

if TYPE_CHECKING:
    from datetime import datetime

    from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker


@dataclass(frozen=True, slots=True)
class ResolvedVersion:
    """A model version as the gateway and the pool manager see it."""

    model: str
    version: str
    artifact_digest: str
    manifest: ModelManifest
    created_at: datetime


def _resolved(model: Model, row: ModelVersion) -> ResolvedVersion:
    manifest = msgspec.convert(row.manifest, ModelManifest)
    return ResolvedVersion(model.name, row.version, row.artifact_digest, manifest, row.created_at)


async def register_version(
    session: AsyncSession, manifest: ModelManifest, version: str, artifact_digest: str
) -> bool:
    """Register ``manifest.name`` at ``version``; returns False if that version already exists."""
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
    return [_resolved(model, version) for model, version in rows.all()]


class Resolver:
    """Model name -> newest version, cached in memory and refreshed from the database."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self._sessions = sessions
        self.versions: dict[str, ResolvedVersion] = {}

    async def refresh(self) -> list[ResolvedVersion]:
        """Reload every model's newest version."""
        async with self._sessions() as session:
            versions = await latest_versions(session)
        self.versions = {v.model: v for v in versions}
        return versions

    async def resolve(self, name: str) -> ResolvedVersion:
        """The newest version of ``name`` (refreshing once on a miss)."""
        version = self.versions.get(name)
        if version is None:
            await self.refresh()
            version = self.versions.get(name)
        if version is None:
            raise ModelNotFound(f"The model `{name}` does not exist.", param="model")
        return version
