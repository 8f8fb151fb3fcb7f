"""Upload (checked against the base model with the worker's own reader), list and delete."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from kiln_platform.adapters.directory import SEPARATOR, AdapterDirectory
from kiln_platform.adapters.schemas import AdapterView
from kiln_platform.admin.authz import require
from kiln_platform.audit.services import record, snapshot
from kiln_platform.db import after_commit
from kiln_platform.db.tables import Adapter, Model, ModelVersion
from kiln_platform.errors import BadRequest, Conflict, NotFound
from kiln_platform.registry.artifacts import local_tree
from kiln_platform.tenants.services import get_tenant
from kiln_runtimes.lora import CONFIG_FILE, WEIGHTS_FILE, AdapterError, Dims, read_adapter

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

    from kiln_platform.admin.authz import Actor
    from kiln_runtimes.store import ArtifactStore

NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
FIELDS = ("name", "model_id", "digest", "rank", "modules", "size_bytes")


@dataclass(frozen=True, kw_only=True)
class Upload:
    """An adapter as uploaded: its name, its base model and PEFT's two files."""

    name: str
    model: str
    config: bytes
    weights: Path


async def create_adapter(
    session: AsyncSession, actor: Actor, tenant_id: uuid.UUID, upload: Upload,
    *, store: ArtifactStore, max_rank: int, directory: AdapterDirectory | None = None,
) -> AdapterView:  # fmt: skip
    """Check the adapter against its model, store its files, register it; 400 names the field.

    ``max_rank``: the columns of a worker's adapter slot (``directory.slot_rank``; 0: no slots).
    ``directory``: the gateway's, which forgets a miss it cached for the name once committed.
    """
    await get_tenant(session, actor, tenant_id)
    require(actor, "adapters", write=True)
    if max_rank < 1:
        raise BadRequest(
            "This platform serves no adapters: its workers have no adapter slots "
            "(KILN_WORKER_ADAPTER_SLOTS).",
            param="model",
        )
    if not NAME.fullmatch(upload.name):
        raise BadRequest("An adapter name is 1-64 of a-z, 0-9, '.', '_', '-'.", param="name")
    model, digest = await _base_model(session, upload.model)
    taken = await session.scalar(
        select(Adapter.id).where(
            Adapter.tenant_id == tenant_id, Adapter.model_id == model.id,
            Adapter.name == upload.name,
        )
    )  # fmt: skip
    if taken is not None:
        raise Conflict(f"This tenant already has an adapter {upload.name!r} of {upload.model}.")
    dims = Dims.from_genai_config(
        json.loads((await local_tree(store, digest) / "genai_config.json").read_text())
    )
    adapter = await asyncio.to_thread(_check, upload, dims, max_rank)
    size = upload.weights.stat().st_size + len(upload.config)
    row = Adapter(
        tenant_id=tenant_id, model_id=model.id, name=upload.name, rank=adapter.rank,
        modules=list(adapter.modules), size_bytes=size,
        digest=await asyncio.to_thread(_store, upload, store),
    )  # fmt: skip
    session.add(row)
    await session.flush()
    await record(session, actor, "adapter.create", "adapter", row.id, tenant_id,
                 after=snapshot(row, *FIELDS))  # fmt: skip
    _forget(session, directory, tenant_id, model.name, upload.name)
    return adapter_view(row, model.name)


async def list_adapters(
    session: AsyncSession, actor: Actor, tenant_id: uuid.UUID
) -> list[AdapterView]:
    """A tenant's adapters, by base model and name."""
    await get_tenant(session, actor, tenant_id)
    require(actor, "adapters")
    rows = await session.execute(
        select(Adapter, Model.name)
        .join(Model, Model.id == Adapter.model_id)
        .where(Adapter.tenant_id == tenant_id)
        .order_by(Model.name, Adapter.name)
    )
    return [adapter_view(row, base) for row, base in rows.tuples()]


async def delete_adapter(
    session: AsyncSession, actor: Actor, tenant_id: uuid.UUID, adapter_id: uuid.UUID,
    directory: AdapterDirectory | None = None,
) -> AdapterView:  # fmt: skip
    """Delete an adapter; returns it. Requests naming it get 404 at once through the gateway
    whose ``directory`` this is (once committed), within the cache TTL (5 s) through others."""
    await get_tenant(session, actor, tenant_id)
    require(actor, "adapters", write=True)
    row = await session.get(Adapter, adapter_id)
    if row is None or row.tenant_id != tenant_id:
        raise NotFound("No such adapter.")
    view = adapter_view(
        row, await session.scalar(select(Model.name).where(Model.id == row.model_id)) or ""
    )
    before = snapshot(row, *FIELDS)
    await session.delete(row)
    await session.flush()
    await record(session, actor, "adapter.delete", "adapter", adapter_id, tenant_id, before=before)
    _forget(session, directory, tenant_id, view.base_model, view.name)
    return view


def _forget(
    session: AsyncSession, directory: AdapterDirectory | None, tenant_id: uuid.UUID, model: str,
    name: str,
) -> None:  # fmt: skip
    """Have ``directory`` forget the adapter's entry once the change is committed."""
    if directory is not None:
        after_commit.defer(session, lambda: directory.forget(tenant_id, model, name))


def adapter_view(row: Adapter, base: str) -> AdapterView:
    return AdapterView(
        id=row.id, tenant_id=row.tenant_id, name=row.name, base_model=base,
        model=f"{base}{SEPARATOR}{row.name}", rank=row.rank, modules=list(row.modules),
        size_bytes=row.size_bytes, created_at=row.created_at,
    )  # fmt: skip


async def _base_model(session: AsyncSession, name: str) -> tuple[Model, str]:
    """A generation model and the artifact of its newest version (the shapes adapters need)."""
    model = await session.scalar(select(Model).where(Model.name == name))
    digest = None
    if model is not None and model.task == "generate":
        digest = await session.scalar(
            select(ModelVersion.artifact_digest)
            .where(ModelVersion.model_id == model.id)
            .order_by(ModelVersion.created_at.desc())
            .limit(1)
        )
    if model is None or digest is None:
        raise BadRequest(f"There is no generation model named {name!r}.", param="model")
    return model, digest


def _check(upload: Upload, dims: Dims, max_rank: int) -> Any:
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    try:
        config = json.loads(upload.config)
    except ValueError as exc:
        raise BadRequest(f"{CONFIG_FILE} is not JSON: {exc}", param="config") from None
    try:
        tensors = load_file(str(upload.weights))
    except (SafetensorError, OSError, ValueError) as exc:
        raise BadRequest(
            f"{WEIGHTS_FILE} is not a safetensors file: {exc}", param="weights"
        ) from None
    if not isinstance(config, dict):
        raise BadRequest(f"{CONFIG_FILE} must be a JSON object.", param="config")
    try:
        return read_adapter(config, tensors, dims, max_rank)
    except AdapterError as exc:
        raise BadRequest(str(exc), param=exc.field) from None


def _store(upload: Upload, store: ArtifactStore) -> str:
    with tempfile.TemporaryDirectory(prefix="adapter-") as tmp:
        folder = Path(tmp)
        (folder / CONFIG_FILE).write_bytes(upload.config)
        shutil.copyfile(upload.weights, folder / WEIGHTS_FILE)
        return store.put_dir(folder)
