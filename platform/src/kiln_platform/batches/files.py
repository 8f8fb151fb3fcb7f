"""`/v1/files`: a tenant's files, their bytes streamed to the artifact store."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import tempfile
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import delete, func, select, tuple_

from kiln_platform.batches._tenant import tenant_tx
from kiln_platform.batches._upload import Staged, receive
from kiln_platform.batches.jsonl import LineChecker
from kiln_platform.batches.schemas import FileDeleted, FileList, FileObject
from kiln_platform.batches.tables import StoredFile
from kiln_platform.errors import BadRequest, NotFound
from kiln_platform.registry.upload import upload_dir

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from kiln_platform.context import Kiln

PURPOSES = ("batch",)
"""What a tenant may upload a file for (``batch_output`` files are Kiln's own)."""


def public_id(prefix: str, id_: uuid.UUID) -> str:
    """``file-<hex>``, ``batch_<hex>``: OpenAI-style ids."""
    return f"{prefix}{id_.hex}"


def parse_id(prefix: str, value: str, what: str, param: str | None = None) -> uuid.UUID:
    """The uuid in an id of ours; ``NotFound`` for anything else."""
    try:
        if value.startswith(prefix):
            return uuid.UUID(hex=value.removeprefix(prefix))
    except ValueError:
        pass
    raise NotFound(f"No such {what}: '{value[:80]}'.", param=param)


def file_object(row: StoredFile) -> FileObject:
    """The OpenAI ``file`` object of a row."""
    return FileObject(
        id=public_id("file-", row.id), bytes=row.bytes, created_at=int(row.created_at.timestamp()),
        filename=row.filename, purpose=row.purpose,
    )  # fmt: skip


async def upload(
    kiln: Kiln, tenant_id: uuid.UUID, chunks: AsyncIterator[bytes], boundary: bytes
) -> FileObject:
    """Store a ``purpose=batch`` JSONL file, streamed to disk and checked line by line; a
    refused upload stores nothing."""
    settings = kiln.settings
    checker = LineChecker(settings.max_batch_lines, settings.max_json_body_bytes)
    with tempfile.TemporaryDirectory(dir=upload_dir(settings), prefix="file-") as tmp:
        staged = Staged(Path(tmp) / "upload", settings.max_batch_file_bytes, checker)
        try:
            fields = await receive(chunks, boundary, staged)
        finally:
            staged.close()
        purpose = fields.get("purpose")
        if purpose not in PURPOSES:
            raise BadRequest(f"'purpose' must be one of {', '.join(PURPOSES)}.", param="purpose")
        lines, digest = staged.finish()
        await asyncio.to_thread(kiln.store.adopt, staged.path, digest)  # hashed as it came in
    row = StoredFile(tenant_id=tenant_id, filename=staged.filename[:255], purpose=purpose,
                     bytes=staged.size, lines=lines, digest=digest,
                     estimated_tokens=checker.tokens)  # fmt: skip
    async with tenant_tx(kiln, tenant_id) as session:
        session.add(row)
        await session.flush()
        await session.refresh(row)
    return file_object(row)


async def find(
    kiln: Kiln, tenant_id: uuid.UUID, file_id: str, param: str = "file_id"
) -> StoredFile:
    """The tenant's file (another tenant's is as missing as one that never was); ``param``:
    the field that named it."""
    id_ = parse_id("file-", file_id, "file", param)
    async with tenant_tx(kiln, tenant_id) as session:
        row = await session.get(StoredFile, id_)
    if row is None or row.tenant_id != tenant_id:
        raise NotFound(f"No such file: '{file_id}'.", param=param)
    return row


async def listed(
    kiln: Kiln, tenant_id: uuid.UUID, purpose: str | None, after: str | None, limit: int
) -> FileList:
    """The tenant's files, newest first, ``limit`` after the one named ``after``."""
    query = select(StoredFile).where(StoredFile.tenant_id == tenant_id)
    if purpose:
        query = query.where(StoredFile.purpose == purpose)
    async with tenant_tx(kiln, tenant_id) as session:
        if after:
            mark = await session.get(StoredFile, parse_id("file-", after, "file", "after"))
            if mark is not None:
                query = query.where(
                    tuple_(StoredFile.created_at, StoredFile.id) < tuple_(mark.created_at, mark.id)
                )
        order = (StoredFile.created_at.desc(), StoredFile.id.desc())
        rows = list(await session.scalars(query.order_by(*order).limit(limit + 1)))
    data = [file_object(r) for r in rows[:limit]]
    return FileList(data=data, has_more=len(rows) > limit,
                    first_id=data[0].id if data else None,
                    last_id=data[-1].id if data else None)  # fmt: skip


def content_path(kiln: Kiln, row: StoredFile) -> Path:
    """Where the file's bytes are."""
    return kiln.store.blob(row.digest)


async def remove(kiln: Kiln, tenant_id: uuid.UUID, file_id: str) -> FileDeleted:
    """Delete the tenant's file, and its bytes unless another file has the same."""
    row = await find(kiln, tenant_id, file_id)
    async with tenant_tx(kiln, tenant_id) as session:
        await session.execute(delete(StoredFile).where(StoredFile.id == row.id))
    async with kiln.db.sessions() as session:  # platform scope: any tenant's file with the bytes
        shared = await session.scalar(
            select(func.count()).select_from(StoredFile).where(StoredFile.digest == row.digest)
        )
    if not shared:
        with contextlib.suppress(ValueError):
            await asyncio.to_thread(kiln.store.remove_blob, row.digest)
    return FileDeleted(id=file_id)


async def store_output(
    kiln: Kiln, tenant_id: uuid.UUID, filename: str, lines: list[str]
) -> StoredFile | None:
    """A ``batch_output`` file of ``lines`` (None for no lines), its row not yet added."""
    if not lines:
        return None
    data = ("\n".join(lines) + "\n").encode()
    digest = hashlib.sha256(data).hexdigest()
    with tempfile.TemporaryDirectory(dir=upload_dir(kiln.settings), prefix="file-") as tmp:
        path = Path(tmp) / "output"
        await asyncio.to_thread(path.write_bytes, data)
        await asyncio.to_thread(kiln.store.adopt, path, digest)
    return StoredFile(id=uuid.uuid4(), tenant_id=tenant_id, filename=filename,
                      purpose="batch_output", bytes=len(data), lines=len(lines),
                      digest=digest)  # fmt: skip
