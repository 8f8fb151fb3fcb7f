"""`/v1/files`: a tenant's files, their bytes streamed to the artifact store. One uploaded with
``expires_after`` (or a batch's output with ``output_expires_after``) reads as gone once it
expired, and ``prune`` deletes it and its bytes."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import tempfile
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import structlog
from sqlalchemy import ColumnElement, delete, func, or_, select, tuple_

from kiln_platform.batches._tenant import tenant_tx
from kiln_platform.batches._upload import Staged, receive
from kiln_platform.batches.jsonl import LineChecker
from kiln_platform.batches.schemas import ExpiresAfter, FileDeleted, FileList, FileObject
from kiln_platform.batches.tables import StoredFile
from kiln_platform.errors import BadRequest, NotFound
from kiln_platform.registry.upload import upload_dir

log = structlog.get_logger("kiln.batches")

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from kiln_platform.context import Kiln

PURPOSES = ("batch",)
"""What a tenant may upload a file for (``batch_output`` files are Kiln's own)."""
EXPIRY_S = (3600, 30 * 86400)
"""The seconds ``expires_after`` may give (OpenAI's: an hour to 30 days)."""
PRUNED = 500
"""Expired files deleted per transaction by ``prune``."""
PRUNE_EVERY_S = 60.0
"""How often each gateway deletes expired files (they read as gone already)."""


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
    expires = int(row.expires_at.timestamp()) if row.expires_at is not None else None
    return FileObject(
        id=public_id("file-", row.id), bytes=row.bytes, created_at=int(row.created_at.timestamp()),
        filename=row.filename, purpose=row.purpose, expires_at=expires,
    )  # fmt: skip


def expiry(after: ExpiresAfter | None, param: str) -> int | None:
    """``expires_after``'s seconds, checked (a 400 naming ``param``); None: no expiry."""
    if after is None:
        return None
    low, high = EXPIRY_S
    if not low <= after.seconds <= high:
        raise BadRequest(f"'{param}.seconds' must be between {low} and {high}.",
                         param=f"{param}.seconds")  # fmt: skip
    return after.seconds


def _expires_after(fields: dict[str, str]) -> ExpiresAfter | None:
    """The upload form's ``expires_after[anchor]`` and ``expires_after[seconds]`` (as the
    openai SDK sends ``expires_after``)."""
    anchor, seconds = fields.get("expires_after[anchor]"), fields.get("expires_after[seconds]")
    if anchor is None and seconds is None:
        return None
    if anchor != "created_at" or seconds is None or not seconds.strip().isdigit():
        raise BadRequest("'expires_after' must be {'anchor': 'created_at', 'seconds': N}.",
                         param="expires_after")  # fmt: skip
    return ExpiresAfter(anchor="created_at", seconds=int(seconds))


def _until(seconds: int | None) -> datetime | None:
    return None if seconds is None else datetime.now(UTC) + timedelta(seconds=seconds)


def _live() -> ColumnElement[bool]:
    """Not expired."""
    return or_(StoredFile.expires_at.is_(None), StoredFile.expires_at > func.now())


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
        kept_s = expiry(_expires_after(fields), "expires_after")
        lines, digest = staged.finish()
        await asyncio.to_thread(kiln.store.adopt, staged.path, digest)  # hashed as it came in
    row = StoredFile(tenant_id=tenant_id, filename=staged.filename[:255], purpose=purpose,
                     bytes=staged.size, lines=lines, digest=digest,
                     estimated_tokens=checker.tokens, expires_at=_until(kept_s))  # fmt: skip
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
    gone = row is not None and row.expires_at is not None and row.expires_at <= datetime.now(UTC)
    if row is None or row.tenant_id != tenant_id or gone:
        raise NotFound(f"No such file: '{file_id}'.", param=param)
    return row


async def listed(
    kiln: Kiln, tenant_id: uuid.UUID, purpose: str | None, after: str | None, limit: int, *,
    order: str = "desc",
) -> FileList:  # fmt: skip
    """The tenant's files, newest first (``order`` ``asc``: oldest first), ``limit`` after the
    one named ``after``."""
    query = select(StoredFile).where(StoredFile.tenant_id == tenant_id, _live())
    if purpose:
        query = query.where(StoredFile.purpose == purpose)
    key, newest = tuple_(StoredFile.created_at, StoredFile.id), order == "desc"
    async with tenant_tx(kiln, tenant_id) as session:
        if after:
            mark = await session.get(StoredFile, parse_id("file-", after, "file", "after"))
            if mark is not None:
                at = tuple_(mark.created_at, mark.id)
                query = query.where(key < at if newest else key > at)
        columns = (StoredFile.created_at, StoredFile.id)
        ordered = [c.desc() if newest else c.asc() for c in columns]
        rows = list(await session.scalars(query.order_by(*ordered).limit(limit + 1)))
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
    await _drop_unused(kiln, {row.digest})
    return FileDeleted(id=file_id)


async def _drop_unused(kiln: Kiln, digests: set[str]) -> None:
    """Remove the bytes of ``digests`` that no file has any more (any tenant's)."""
    async with kiln.db.sessions() as session:  # platform scope
        used = set(await session.scalars(
            select(StoredFile.digest).where(StoredFile.digest.in_(digests)).distinct()
        ))  # fmt: skip
    for digest in digests - used:
        with contextlib.suppress(ValueError):
            await asyncio.to_thread(kiln.store.remove_blob, digest)


async def prune(kiln: Kiln) -> int:
    """Delete every tenant's expired files (``PRUNED`` a transaction, rows others hold
    skipped) and their bytes; how many."""
    deleted = 0
    while True:
        async with kiln.db.sessions.begin() as session:
            expired = (
                select(StoredFile.id).where(StoredFile.expires_at <= func.now())
                .limit(PRUNED).with_for_update(skip_locked=True)
            )  # fmt: skip
            digests = list(await session.scalars(
                delete(StoredFile).where(StoredFile.id.in_(expired)).returning(StoredFile.digest)
            ))  # fmt: skip
        if digests:
            await _drop_unused(kiln, set(digests))
        deleted += len(digests)
        if len(digests) < PRUNED:
            return deleted


async def pruning(kiln: Kiln) -> None:
    """``prune`` every ``PRUNE_EVERY_S`` (on each gateway; they skip each other's rows)."""
    while True:
        try:
            if pruned := await prune(kiln):
                log.info("expired files deleted", files=pruned)
        except Exception:
            log.exception("file prune failed; will retry")
        await asyncio.sleep(PRUNE_EVERY_S)


async def store_output(
    kiln: Kiln, tenant_id: uuid.UUID, filename: str, lines: list[str], expires_s: int | None
) -> StoredFile | None:
    """A ``batch_output`` file of ``lines`` (None for no lines), its row not yet added; it
    expires ``expires_s`` from now, if given."""
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
                      digest=digest, expires_at=_until(expires_s))  # fmt: skip
