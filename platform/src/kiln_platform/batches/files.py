"""`/v1/files`: a tenant's files, their bytes streamed to the artifact store. One uploaded with
``expires_after`` (or a batch's output with ``output_expires_after``; else after
``KILN_BATCH_FILE_TTL_S``, OpenAI's 30 days) reads as gone once it expired, and ``prune`` deletes
it and its bytes.

Files with the same bytes share one blob: a row is added with its bytes (``add``), and bytes
no row names are removed (``drop_unused``), under the digest's advisory lock, so a removal
never takes the bytes of a file being added."""

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
from sqlalchemy import ColumnElement, delete, exists, func, or_, select, tuple_

from kiln_platform.batches._tenant import tenant_tx
from kiln_platform.batches._upload import Staged, receive
from kiln_platform.batches.jsonl import LineChecker
from kiln_platform.batches.schemas import OPEN, ExpiresAfter, FileDeleted, FileList, FileObject
from kiln_platform.batches.tables import BatchJob, StoredFile
from kiln_platform.errors import BadRequest, NotFound
from kiln_platform.registry.upload import upload_dir

log = structlog.get_logger("kiln.batches")

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from sqlalchemy.ext.asyncio import AsyncSession

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


def expiry(after: ExpiresAfter | None, param: str, default_s: int) -> int | None:
    """``expires_after``'s seconds, checked (a 400 naming ``param``), else ``default_s``;
    None: no expiry (``default_s`` 0)."""
    if after is None:
        return default_s or None
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
        kept_s = expiry(_expires_after(fields), "expires_after", settings.batch_file_ttl_s)
        lines, digest = staged.finish()  # hashed as it came in
        row = StoredFile(tenant_id=tenant_id, filename=staged.filename[:255], purpose=purpose,
                         bytes=staged.size, lines=lines, digest=digest,
                         estimated_tokens=checker.tokens, expires_at=_until(kept_s))  # fmt: skip
        async with tenant_tx(kiln, tenant_id) as session:
            await add(kiln, session, row, staged.path)
            await session.refresh(row)
    return file_object(row)


async def _hold(session: AsyncSession, digest: str) -> None:
    """The blob's advisory lock, to the end of the transaction."""
    key = func.hashtextextended(f"kiln.files.blob:{digest}", 0)
    await session.execute(select(func.pg_advisory_xact_lock(key)))


async def add(kiln: Kiln, session: AsyncSession, row: StoredFile, src: Path) -> None:
    """Add ``row`` in ``session``'s transaction, its bytes (``src``, hashed as ``row.digest``)
    moved into the store under the blob's lock: a removal of the same bytes waits for the
    transaction, then sees the row."""
    await _hold(session, row.digest)
    await asyncio.to_thread(kiln.store.adopt, src, row.digest)
    session.add(row)
    await session.flush()


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
    await drop_unused(kiln, {row.digest})
    return FileDeleted(id=file_id)


async def drop_unused(kiln: Kiln, digests: set[str]) -> None:
    """Remove the bytes of ``digests`` that no file has any more (any tenant's), each under
    its lock (a file being added with them keeps them)."""
    for digest in sorted(digests):
        async with kiln.db.sessions.begin() as session:  # platform scope
            await _hold(session, digest)
            used = await session.scalar(select(exists().where(StoredFile.digest == digest)))
            if not used:
                with contextlib.suppress(ValueError):
                    await asyncio.to_thread(kiln.store.remove_blob, digest)


def _read() -> ColumnElement[bool]:
    """The input of a batch still open (it reads its lines until it ends)."""
    return exists().where(BatchJob.input_file_id == StoredFile.id, BatchJob.status.in_(OPEN))


async def prune(kiln: Kiln) -> int:
    """Delete every tenant's expired files (``PRUNED`` a transaction, rows others hold
    skipped; an open batch's input once the batch ended) and their bytes; how many."""
    deleted = 0
    while True:
        async with kiln.db.sessions.begin() as session:
            expired = (
                select(StoredFile.id).where(StoredFile.expires_at <= func.now(), ~_read())
                .limit(PRUNED).with_for_update(skip_locked=True)
            )  # fmt: skip
            digests = list(await session.scalars(
                delete(StoredFile).where(StoredFile.id.in_(expired)).returning(StoredFile.digest)
            ))  # fmt: skip
        if digests:
            await drop_unused(kiln, set(digests))
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


def _output(
    tenant_id: uuid.UUID, filename: str, lines: list[str], expires_s: int | None, tmp: Path,
    *, purpose: str = "batch_output",
) -> tuple[StoredFile, Path] | None:  # fmt: skip
    """A ``batch_output`` file (or of ``purpose``) of ``lines`` (None for no lines) and its
    bytes, written in ``tmp``."""
    if not lines:
        return None
    data = ("\n".join(lines) + "\n").encode()
    path = tmp / filename
    path.write_bytes(data)
    digest = hashlib.sha256(data).hexdigest()
    row = StoredFile(id=uuid.uuid4(), tenant_id=tenant_id, filename=filename,
                     purpose=purpose, bytes=len(data), lines=len(lines),
                     digest=digest, expires_at=_until(expires_s))  # fmt: skip
    return row, path


async def store_outputs(
    kiln: Kiln, session: AsyncSession, tenant_id: uuid.UUID, name: str, *,
    lines: list[tuple[bool, str]], expires_s: int | None,
) -> tuple[StoredFile | None, StoredFile | None]:  # fmt: skip
    """A batch's output and error files (``<name>_output.jsonl`` of its ``ok`` lines, and
    ``<name>_error.jsonl``; None for no lines), added in ``session``'s transaction; they
    expire ``expires_s`` from now, if given."""
    outputs: list[StoredFile | None] = []
    with tempfile.TemporaryDirectory(dir=upload_dir(kiln.settings), prefix="file-") as tmp:
        for kind, ok in (("output", True), ("error", False)):
            kept = [o for good, o in lines if good is ok]
            made = await asyncio.to_thread(
                _output, tenant_id, f"{name}_{kind}.jsonl", kept, expires_s, Path(tmp)
            )
            if made is not None:
                await add(kiln, session, *made)
            outputs.append(made[0] if made else None)
    return outputs[0], outputs[1]


async def store_input(
    kiln: Kiln, tenant_id: uuid.UUID, filename: str, lines: list[str], tokens: int
) -> StoredFile:
    """A ``purpose=batch`` file of ``lines`` made here (an Anthropic batch's requests:
    ``message_batches``), ``tokens`` its estimate, kept as an upload is."""
    kept_s = expiry(None, "expires_after", kiln.settings.batch_file_ttl_s)
    with tempfile.TemporaryDirectory(dir=upload_dir(kiln.settings), prefix="file-") as tmp:
        made = await asyncio.to_thread(
            _output, tenant_id, filename, lines, kept_s, Path(tmp), purpose="batch"
        )
        if made is None:
            raise BadRequest("A batch needs at least one request.", param="requests")
        row, path = made
        row.estimated_tokens = tokens
        async with tenant_tx(kiln, tenant_id) as session:
            await add(kiln, session, row, path)
    return row
