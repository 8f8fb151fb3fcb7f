"""Uploading a model version: stream to disk, validate, store, register, all or nothing.

Validation runs before anything is stored, so a rejected upload leaves no blob, tree or row.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
from sqlalchemy import select

from kiln_platform.admin.authz import require
from kiln_platform.audit.services import record
from kiln_platform.db.tables import Model
from kiln_platform.errors import BadRequest, Conflict
from kiln_platform.registry import validation
from kiln_platform.registry.numbering import claim_name, free_version
from kiln_platform.registry.services import register_version
from kiln_runtimes.protocol import MANIFEST_NAME, ModelManifest

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

    from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

    from kiln_platform.admin.authz import Actor
    from kiln_platform.settings import Settings
    from kiln_runtimes.store import ArtifactStore

NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,199}")
VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def check_names(name: str, version: str | None) -> None:
    """A model name and version (if one) as the registry keeps them; a 400 naming the field."""
    if not NAME.fullmatch(name):
        raise BadRequest(f"invalid model name {name!r}: lowercase letters, digits, . _ -",
                         param="name")  # fmt: skip
    if version is not None and not VERSION.fullmatch(version):
        raise BadRequest(f"invalid version {version!r}", param="version")


@dataclass(frozen=True, slots=True)
class Uploaded:
    """A registered version."""

    model: str
    version: str
    artifact_digest: str
    manifest: ModelManifest


def upload_dir(settings: Settings) -> Path:
    """Where uploads are staged (inside the data directory, so renames stay on one filesystem)."""
    path = settings.data_dir / "tmp"
    path.mkdir(parents=True, exist_ok=True)
    return path


async def receive(chunks: AsyncIterator[bytes], dest: Path, max_bytes: int) -> int:
    """Write a streamed body to ``dest``; ``BadRequest`` (and no file) beyond ``max_bytes``."""
    size = 0
    try:
        with dest.open("wb") as f:
            async for chunk in chunks:
                size += len(chunk)
                if size > max_bytes:
                    raise BadRequest(f"the upload exceeds the {max_bytes}-byte limit")
                f.write(chunk)
        if size == 0:
            raise BadRequest("the upload is empty")
    except BaseException:
        await asyncio.to_thread(dest.unlink, missing_ok=True)
        raise
    return size


async def upload_version(
    sessions: async_sessionmaker[AsyncSession],
    store: ArtifactStore,
    settings: Settings,
    name: str,
    source: Path,
    *,
    actor: Actor,
    version: str | None = None,
    refresh: Callable[[], Awaitable[object]] | None = None,
) -> Uploaded:
    """Validate ``source`` (.onnx, .zip/.tar, or a folder) and register it as ``name``
    (platform-admin: a model serves every tenant); audited as ``model.version.create``.

    ``refresh``: the gateway's resolver's, run once the version is committed (it serves at
    once through this gateway)."""
    require(actor, "models", write=True)
    check_names(name, version)
    async with sessions() as session:  # a taken version fails before anything is stored
        await free_version(session, name, "tensor", version)
    with tempfile.TemporaryDirectory(dir=upload_dir(settings), prefix="upload-") as tmp:
        folder = Path(tmp) / "model"
        manifest = await asyncio.to_thread(_prepare, name, source, folder, settings)
        digest = await asyncio.to_thread(store.put_dir, folder)
    async with sessions.begin() as session:
        await claim_name(session, name)  # checked again, now that no one else may claim it
        version = await free_version(session, name, "tensor", version)
        if not await register_version(session, manifest, version, digest, imported_by=actor.name):
            raise Conflict(f"{name} version {version} already exists")
        model_id = await session.scalar(select(Model.id).where(Model.name == name))
        await record(session, actor, "model.version.create", "model", model_id, None,
                     after={"version": version, "artifact_digest": digest})  # fmt: skip
    if refresh is not None:
        await refresh()
    return Uploaded(name, version, digest, manifest)


def _prepare(name: str, source: Path, folder: Path, settings: Settings) -> ModelManifest:
    """Stage ``source`` as ``folder``, validate it and write its manifest (blocking)."""
    if source.is_dir():
        shutil.copytree(source, folder)
    else:
        if source.stat().st_size > settings.max_upload_bytes:
            raise BadRequest(f"the upload exceeds the {settings.max_upload_bytes}-byte limit")
        staged = folder.parent / "upload"
        shutil.copyfile(source, staged)
        validation.unpack(staged, folder, settings.max_upload_bytes)
    checked = validation.inspect(folder, settings.min_opset, settings.max_opset)
    manifest = ModelManifest(
        name=name,
        task="tensor",
        engine="onnxruntime",
        model_file=checked.model_file,
        tokenizer_file=None,
        inputs=checked.inputs,
        outputs=checked.outputs,
        opset=checked.opset,
        batching=checked.batching,
        source="upload",
    )
    (folder / MANIFEST_NAME).write_bytes(msgspec.json.encode(manifest))
    return manifest
