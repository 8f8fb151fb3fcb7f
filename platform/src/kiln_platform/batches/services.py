"""`/v1/batches`: create, retrieve, list, cancel; the OpenAI objects and status machine.

A batch is created ``validating``; a runner (``batches.runner``) takes it from there:
``validating`` → ``in_progress`` (or ``failed``, errors naming the line) → ``finalizing`` →
``completed``; ``expired`` past its window; a cancel moves ``validating``/``in_progress`` to
``cancelling``, and the runner, once its running lines are done, to ``cancelled``.
"""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import msgspec
from sqlalchemy import case, func, select, tuple_, update

from kiln_platform.batches import quota
from kiln_platform.batches._tenant import tenant_tx
from kiln_platform.batches.files import expiry, find, parse_id, public_id
from kiln_platform.batches.schemas import (
    ENDPOINTS,
    BatchCreate,
    BatchError,
    BatchErrors,
    BatchList,
    BatchObject,
    RequestCounts,
)
from kiln_platform.batches.tables import BatchJob, BatchLine
from kiln_platform.errors import BadRequest, Conflict, NotFound

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

    from kiln_platform.context import Kiln
    from kiln_platform.keys.services import Principal

WINDOWS = ("24h",)
"""Completion windows a batch may ask for; it lasts ``KILN_BATCH_WINDOW_S`` (24 hours)."""
MAX_METADATA = 16


def _epoch(at: datetime | None) -> int | None:
    return None if at is None else int(at.timestamp())


def _file_id(id_: uuid.UUID | None) -> str | None:
    return None if id_ is None else public_id("file-", id_)


def batch_object(row: BatchJob, counts: RequestCounts) -> BatchObject:
    """The OpenAI ``batch`` object of a row and its line counts."""
    errors = None
    if row.errors:
        errors = BatchErrors(data=[msgspec.convert(e, BatchError) for e in row.errors])
    return BatchObject(
        id=public_id("batch_", row.id), endpoint=row.endpoint,
        input_file_id=_file_id(row.input_file_id), completion_window=row.completion_window,
        status=row.status,  # type: ignore[arg-type]  # the table holds only the statuses
        created_at=int(row.created_at.timestamp()), expires_at=_epoch(row.expires_at),
        request_counts=counts, errors=errors, output_file_id=_file_id(row.output_file_id),
        error_file_id=_file_id(row.error_file_id), metadata=row.metadata_,
        in_progress_at=_epoch(row.in_progress_at), finalizing_at=_epoch(row.finalizing_at),
        completed_at=_epoch(row.completed_at), failed_at=_epoch(row.failed_at),
        expired_at=_epoch(row.expired_at), cancelling_at=_epoch(row.cancelling_at),
        cancelled_at=_epoch(row.cancelled_at),
    )  # fmt: skip


async def counts(session: AsyncSession, rows: list[BatchJob]) -> dict[uuid.UUID, RequestCounts]:
    """Each batch's lines: total, finished fine, failed."""
    ids = [r.id for r in rows]
    found = {r.id: RequestCounts(total=r.total) for r in rows}
    if ids:
        query = (
            select(BatchLine.batch_id, func.count(), func.sum(case((BatchLine.ok, 1), else_=0)))
            .where(BatchLine.batch_id.in_(ids))
            .group_by(BatchLine.batch_id)
        )
        for batch_id, done, ok in await session.execute(query):
            found[batch_id].completed, found[batch_id].failed = int(ok), done - int(ok)
    return found


def _checked(data: BatchCreate) -> None:
    if data.endpoint not in ENDPOINTS:
        raise BadRequest(
            f"'endpoint' is {data.endpoint!r}; batches run {', '.join(ENDPOINTS)}.",
            param="endpoint",
        )
    if data.completion_window not in WINDOWS:
        raise BadRequest("'completion_window' must be '24h'.", param="completion_window")
    if data.metadata is not None and len(data.metadata) > MAX_METADATA:
        raise BadRequest(f"'metadata' takes at most {MAX_METADATA} pairs.", param="metadata")
    if any(len(k) > 64 or len(v) > 512 for k, v in (data.metadata or {}).items()):
        raise BadRequest("'metadata' keys take at most 64 characters, values 512.",
                         param="metadata")  # fmt: skip


def _runs_as(principal: Principal) -> dict[str, Any]:
    """The creator, stored with the batch: its lines run (and are billed) as it."""
    who = dataclasses.replace(principal, expires_at=None)
    return msgspec.to_builtins(who)  # type: ignore[no-any-return]


async def create(kiln: Kiln, principal: Principal, data: BatchCreate) -> BatchObject:
    """A new batch, ``validating`` until a runner checks its lines; refused (429) if a batch
    quota has no room for its file's estimated tokens (``batches.quota``)."""
    _checked(data)
    kept_s = expiry(
        data.output_expires_after, "output_expires_after", kiln.settings.batch_file_ttl_s
    )
    source = await find(kiln, principal.tenant_id, data.input_file_id, "input_file_id")
    if source.purpose != "batch":
        raise BadRequest("'input_file_id' must name a file of purpose 'batch'.",
                         param="input_file_id")  # fmt: skip
    await quota.admit(kiln, principal, source.estimated_tokens)
    now = datetime.now(UTC)
    expires = now + timedelta(seconds=kiln.settings.batch_window_s)
    row = BatchJob(
        id=uuid.uuid4(), tenant_id=principal.tenant_id, endpoint=data.endpoint,
        input_file_id=source.id, completion_window=data.completion_window,
        status="validating", metadata_=data.metadata, principal=_runs_as(principal),
        output_expires_s=kept_s,
        total=source.lines, estimated_tokens=source.estimated_tokens, created_at=now,
        expires_at=expires,
    )  # fmt: skip
    async with tenant_tx(kiln, principal.tenant_id) as session:
        session.add(row)
    return batch_object(row, RequestCounts(total=row.total))


async def _one(session: AsyncSession, tenant_id: uuid.UUID, batch_id: str) -> BatchJob:
    row = await session.get(BatchJob, parse_id("batch_", batch_id, "batch", "batch_id"))
    if row is None or row.tenant_id != tenant_id:
        raise NotFound(f"No such batch: '{batch_id}'.", param="batch_id")
    return row


async def retrieve(kiln: Kiln, tenant_id: uuid.UUID, batch_id: str) -> BatchObject:
    """One of the tenant's batches."""
    async with tenant_tx(kiln, tenant_id) as session:
        row = await _one(session, tenant_id, batch_id)
        found = await counts(session, [row])
    return batch_object(row, found[row.id])


async def listed(kiln: Kiln, tenant_id: uuid.UUID, after: str | None, limit: int) -> BatchList:
    """The tenant's batches, newest first, ``limit`` after the one named ``after``."""
    query = select(BatchJob).where(BatchJob.tenant_id == tenant_id)
    async with tenant_tx(kiln, tenant_id) as session:
        if after:
            mark = await session.get(BatchJob, parse_id("batch_", after, "batch", "after"))
            if mark is not None:
                newer = tuple_(BatchJob.created_at, BatchJob.id) < tuple_(mark.created_at, mark.id)
                query = query.where(newer)
        order = (BatchJob.created_at.desc(), BatchJob.id.desc())
        rows = list(await session.scalars(query.order_by(*order).limit(limit + 1)))
        found = await counts(session, rows[:limit])
    data = [batch_object(r, found[r.id]) for r in rows[:limit]]
    return BatchList(data=data, has_more=len(rows) > limit,
                     first_id=data[0].id if data else None,
                     last_id=data[-1].id if data else None)  # fmt: skip


async def cancel(kiln: Kiln, tenant_id: uuid.UUID, batch_id: str) -> BatchObject:
    """Ask the batch to stop: ``cancelling`` (no new line starts) until its runner has let the
    running ones finish and written the files (``cancelled``)."""
    async with tenant_tx(kiln, tenant_id) as session:
        row = await _one(session, tenant_id, batch_id)
        moved = await session.scalar(
            update(BatchJob)
            .where(BatchJob.id == row.id, BatchJob.status.in_(("validating", "in_progress")))
            .values(status="cancelling", cancelling_at=func.now())
            .returning(BatchJob.id)
        )
        if moved is None and row.status not in ("cancelling", "cancelled"):
            raise Conflict(f"The batch is {row.status}; it cannot be cancelled.")
        if moved is not None:  # this gateway's runner starts no line from now on, so the
            kiln.batches.cancelled(row.id)  # counts below miss at most the lines in flight
        await session.refresh(row)
        found = await counts(session, [row])
    return batch_object(row, found[row.id])


async def remove(kiln: Kiln, tenant_id: uuid.UUID, batch_id: str) -> None:
    """Delete one of the tenant's batches with its recorded lines (its files stay: the
    caller's to remove)."""
    async with tenant_tx(kiln, tenant_id) as session:
        await session.delete(await _one(session, tenant_id, batch_id))


async def page(
    kiln: Kiln, tenant_id: uuid.UUID, endpoint: str, *, limit: int,
    after: uuid.UUID | None = None, before: uuid.UUID | None = None,
) -> tuple[list[BatchObject], bool]:  # fmt: skip
    """The tenant's batches of ``endpoint``, newest first: ``limit`` of them older than the
    one ``after`` names, or the ``limit`` just newer than ``before``'s; and whether more lie
    that way."""
    query = select(BatchJob).where(BatchJob.tenant_id == tenant_id, BatchJob.endpoint == endpoint)
    key = tuple_(BatchJob.created_at, BatchJob.id)
    newest = (BatchJob.created_at.desc(), BatchJob.id.desc())
    async with tenant_tx(kiln, tenant_id) as session:
        mark = await session.get(BatchJob, after or before) if after or before else None
        if (after or before) and (mark is None or mark.tenant_id != tenant_id):
            raise NotFound(
                "No such batch to page from.", param="after_id" if after else "before_id"
            )
        order = newest
        if mark is not None and after:
            query = query.where(key < tuple_(mark.created_at, mark.id))
        elif mark is not None:
            query = query.where(key > tuple_(mark.created_at, mark.id))
            order = (BatchJob.created_at.asc(), BatchJob.id.asc())
        rows = list(await session.scalars(query.order_by(*order).limit(limit + 1)))
        more, rows = len(rows) > limit, rows[:limit]
        if before:
            rows.reverse()
        found = await counts(session, rows)
    return [batch_object(r, found[r.id]) for r in rows], more
