"""The gateway's batch runner: claims a batch from PostgreSQL, runs its lines, finalizes it.

Claims are leases (``batches.lease_owner``/``lease_until``, taken with ``FOR UPDATE SKIP
LOCKED``), so several gateways share the batches and a killed gateway's batch is taken over
once its lease lapses. A line is skipped if it is recorded already (``batch_lines``), and
recording is keyed by (batch, ``custom_id``) with the line's ledger row in the same
transaction, so whatever crashes a line appears once and is billed once.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import msgspec
import structlog
from sqlalchemy import func, select, update

from kiln_platform.batches import events, lines, metrics, quota
from kiln_platform.batches.claims import Claim
from kiln_platform.batches.files import drop_unused, pruning, public_id, store_outputs
from kiln_platform.batches.jsonl import check_line
from kiln_platform.batches.recorder import GROUP, LineRecorder
from kiln_platform.batches.schemas import OPEN
from kiln_platform.batches.tables import BatchJob, BatchLine, StoredFile
from kiln_platform.batches.validation import check_batch, read_lines
from kiln_platform.db.tables import ApiKey, OAuthClient
from kiln_platform.keys.services import Principal

if TYPE_CHECKING:
    from pathlib import Path

    from kiln_platform.context import Kiln
    from kiln_platform.settings import Settings

log = structlog.get_logger("kiln.batches")
RETRIES = 8
"""Tries of a line that meets a transient error (full queue, pool starting) before it fails."""
HELD = 32
"""Batches one gateway runs at once, one per tenant (other gateways claim the rest)."""


class BatchRunner:
    """Runs batches in this gateway, ``concurrency`` lines at a time (class ``batch``): one
    open batch per tenant at once, whose lines take the slots in turn (fair between tenants).

    A Kiln service like the others, but one that runs requests through all of them: ``start``
    hands it the built ``Kiln`` (after the pools started), and it stops before any of them.
    """

    _kiln: Kiln

    def __init__(self, settings: Settings) -> None:
        self._concurrency = settings.batch_concurrency
        self._record_s = settings.batch_record_s
        self._lease = timedelta(seconds=settings.batch_lease_s)
        self._poll_s = min(settings.batch_poll_s, settings.batch_lease_s / 3)
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"[:64]
        self._task: asyncio.Task[None] | None = None
        self._claims: dict[uuid.UUID, Claim] = {}
        """The batches this runner holds, by id."""

    def cancelled(self, batch_id: uuid.UUID) -> None:
        """A cancel of ``batch_id`` was committed in this process: if this runner holds it, no
        line starts from now on (other gateways' runners see it at their next poll)."""
        claim = self._claims.get(batch_id)
        if claim is not None and claim.status in ("validating", "in_progress"):
            claim.status = "cancelling"

    def start(self, kiln: Kiln) -> None:
        """Work for ``kiln``; start claiming batches (none with ``KILN_BATCH_CONCURRENCY=0``)."""
        self._kiln = kiln
        self._recorder = LineRecorder(kiln, self._record_s)
        self._free = asyncio.Semaphore(self._concurrency)
        self._unrecorded = asyncio.Semaphore(max(GROUP, self._concurrency))
        self._pruning = asyncio.create_task(pruning(kiln), name="file-prune")
        if self._concurrency > 0:
            self._task = asyncio.create_task(self._loop(), name="batch-runner")

    async def stop(self) -> None:
        """Stop: lines in flight are dropped unrecorded (another run does them again)."""
        self._pruning.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._pruning
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            await self._recorder.stop()

    async def _loop(self) -> None:
        """Claim open batches, one per tenant, and run them side by side: each batch's next
        line waits on the shared ``_free`` slots, a FIFO semaphore, so the slots go to the
        batches in turn and every tenant with a batch here gets an equal share of them."""
        held: dict[uuid.UUID, asyncio.Task[None]] = {}
        try:
            while True:
                job = None
                try:
                    await metrics.count_open(self._kiln.db.sessions)
                    job = await self.claim(skip=set(held)) if len(held) < HELD else None
                except Exception:
                    log.exception("batch runner failed; will retry")
                if job is not None:
                    held[job.tenant_id] = asyncio.create_task(self._guarded(job))
                    continue
                await self._wait(set(held.values()))
                held = {tenant: task for tenant, task in held.items() if not task.done()}
        finally:
            for task in held.values():
                task.cancel()
            await asyncio.gather(*held.values(), return_exceptions=True)

    async def _wait(self, running: set[asyncio.Task[None]]) -> None:
        """One poll, or less if a batch ends (its tenant's next batch is claimed at once)."""
        if running:
            await asyncio.wait(running, timeout=self._poll_s, return_when=asyncio.FIRST_COMPLETED)
        else:
            await asyncio.sleep(self._poll_s)

    async def _guarded(self, job: BatchJob) -> None:
        try:
            await self.process(job)
        except Exception:
            log.exception("batch runner failed; will retry", batch=str(job.id))

    async def claim(self, skip: set[uuid.UUID] | None = None) -> BatchJob | None:
        """Take the oldest open batch nobody holds (or whose holder's lease lapsed), of a
        tenant not in ``skip`` (those this runner runs a batch of already)."""
        async with self._kiln.db.sessions.begin() as session:
            job = await session.scalar(
                select(BatchJob)
                .where(BatchJob.status.in_(OPEN))
                .where((BatchJob.lease_until.is_(None)) | (BatchJob.lease_until < func.now()))
                .where(BatchJob.tenant_id.not_in(skip or ()))
                .order_by(BatchJob.created_at)
                .limit(1)
                .with_for_update(skip_locked=True)
            )
            if job is not None:
                job.lease_owner, job.lease_until = self.owner, datetime.now(UTC) + self._lease
        return job

    async def process(self, job: BatchJob) -> None:
        """Take the batch as far as it goes: validate, run, finalize."""
        claim = self._claims[job.id] = Claim(job, job.status)
        keeper = asyncio.create_task(self._keep(claim), name="batch-lease")
        try:
            if claim.status == "validating":
                await self._validate(claim)
            claim.revoked = await self._revoked(job)
            running = claim.status in ("in_progress", "cancelling") and not claim.lost
            if running and not await self._run(claim):
                await self.give_back(claim)
                return  # a line could not be recorded: claimed again once the lease lapses
            if not claim.lost and claim.status in ("in_progress", "cancelling", "finalizing"):
                await self._finalize(claim)
        finally:
            del self._claims[job.id]
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeper

    async def give_back(self, claim: Claim) -> None:
        """Let the batch go for one lease, so that ``claim`` takes the next open batch: given
        back free, the oldest batch is claimed again at once and, while its lines keep failing,
        holds up every batch behind it."""
        until = func.now() + self._lease
        await self._move(claim, claim.status, (claim.status,), lease_until=until)

    async def _keep(self, claim: Claim) -> None:
        """Every poll: renew the lease, read the batch's status (a cancel), check its key (a
        revoke)."""
        while True:
            await asyncio.sleep(self._poll_s)
            try:
                async with self._kiln.db.sessions.begin() as session:
                    status = await session.scalar(
                        update(BatchJob)
                        .where(BatchJob.id == claim.job.id, BatchJob.lease_owner == self.owner)
                        .values(lease_until=func.now() + self._lease)
                        .returning(BatchJob.status)
                    )
                claim.revoked = claim.revoked or await self._revoked(claim.job)
            except Exception:  # the database is away: keep going while the lease lasts
                log.exception("renewing a batch lease failed; will retry")
                continue
            if status is None:
                claim.lost = True
                log.warning("batch lease lost", batch=str(claim.job.id))
                return
            if not (claim.status == "cancelling" and status == "in_progress"):
                claim.status = status  # a cancel taken here is newer than what this poll read

    async def _revoked(self, job: BatchJob) -> bool:
        """Whether the API key or OAuth client the batch runs as is revoked or gone."""
        key_id, client_id = job.principal.get("key_id"), job.principal.get("oauth_client_id")
        if key_id is None and client_id is None:
            return False
        async with self._kiln.db.sessions() as session:
            row: ApiKey | OAuthClient | None
            if key_id is not None:
                row = await session.get(ApiKey, uuid.UUID(key_id))
            else:
                row = await session.get(OAuthClient, uuid.UUID(client_id))
        return row is None or row.revoked_at is not None

    async def _move(
        self, claim: Claim, status: str, frm: tuple[str, ...], **values: object
    ) -> None:
        """Move the batch to ``status`` if it is in one of ``frm`` (a cancel may have won)."""
        async with self._kiln.db.sessions.begin() as session:
            moved = await session.scalar(
                update(BatchJob)
                .where(BatchJob.id == claim.job.id, BatchJob.status.in_(frm))
                .where(BatchJob.lease_owner == self.owner)
                .values(status=status, **values)
                .returning(BatchJob.status)
            )
            if moved is None:
                now = await session.scalar(
                    select(BatchJob.status).where(BatchJob.id == claim.job.id)
                )
                claim.status = now or claim.status
                return
            await events.ended(session, claim.job, status)
        claim.status = status

    async def _validate(self, claim: Claim) -> None:
        job = claim.job
        path = await self._input_path(job)
        errors = await check_batch(self._kiln, job.tenant_id, job.endpoint, path) if path else []
        if path is None or errors:
            found = [msgspec.to_builtins(e) for e in errors] or [
                {"code": "file_not_found", "message": "The input file was deleted.",
                 "param": "input_file_id", "line": None}
            ]  # fmt: skip
            await self._move(claim, "failed", ("validating",), errors=found, failed_at=func.now(),
                             lease_until=None)  # fmt: skip
            if claim.status == "failed":
                metrics.BATCHES_ENDED.labels("failed").inc()
            return
        await self._move(claim, "in_progress", ("validating",), in_progress_at=func.now())

    async def _input_path(self, job: BatchJob) -> Path | None:
        if job.input_file_id is None:
            return None
        async with self._kiln.db.sessions() as session:
            digest = await session.scalar(
                select(StoredFile.digest).where(StoredFile.id == job.input_file_id)
            )
        path = None if digest is None else self._kiln.store.blob(digest)
        return path if path is not None and path.is_file() else None

    async def _run(self, claim: Claim) -> bool:
        """Start each line not recorded yet, ``concurrency`` at a time, until done or stopped;
        whether every line started was recorded."""
        job = claim.job
        path = await self._input_path(job)
        if path is None:
            return True
        done = await self._done(job)
        principal = msgspec.convert(job.principal, Principal)
        free = self._free  # shared by the batches this runner holds, taken in turn
        started: list[asyncio.Task[bool]] = []
        async with asyncio.TaskGroup() as group:
            for n, raw in read_lines(path):
                item = check_line(n, raw)
                if item.custom_id in done:
                    continue
                await quota.within_day(self._kiln, principal, item.body, claim.stopping,
                                       self._poll_s)  # fmt: skip
                await self._unrecorded.acquire()  # bounds the lines the recorder holds
                await free.acquire()
                if claim.stopping():
                    free.release()
                    self._unrecorded.release()
                    break
                line = lines.Line(job.id, job.tenant_id, job.endpoint, n, item.custom_id, item.body)
                started.append(group.create_task(self._line(claim, principal, line, free)))
        return all(t.result() for t in started)

    async def _done(self, job: BatchJob) -> set[str]:
        """The ``custom_id`` of each line of ``job`` recorded so far."""
        async with self._kiln.db.sessions() as session:
            return set(await session.scalars(
                select(BatchLine.custom_id).where(BatchLine.batch_id == job.id)
            ))  # fmt: skip

    async def _unrun(self, job: BatchJob, outcome: str, error: dict[str, str]) -> bool:
        """Record the lines not run (``outcome`` ``expired`` or ``revoked``) as ``error``
        lines; whether there were any."""
        path, done = await self._input_path(job), await self._done(job)
        rest = [(n, item.custom_id) for n, raw in (read_lines(path) if path else ())
                if (item := check_line(n, raw)).custom_id not in done]  # fmt: skip
        await lines.unrun(self._kiln, job.id, job.tenant_id, rest, error)
        metrics.LINES.labels(outcome).inc(len(rest))
        return bool(rest)

    async def _line(
        self, claim: Claim, principal: Principal, line: lines.Line, free: asyncio.Semaphore
    ) -> bool:
        """Run and record one line; False if it could not be (it runs again later). Its slot
        is free once it ran: the next line starts while its group is recorded."""
        began = time.monotonic()
        try:
            try:
                outcome = await self._attempts(claim, principal, line)
            finally:
                free.release()
            if isinstance(outcome, bool):
                return outcome
            if not claim.lost and await self._recorder.record(line, outcome):
                metrics.LINES.labels("ok" if outcome.ok else "error").inc()
                metrics.LINE_SECONDS.observe(time.monotonic() - began)
                await quota.count(self._kiln, principal, outcome.usage)
        except Exception:
            log.exception("batch line not recorded", batch=str(claim.job.id), line=line.n)
            return False
        finally:
            self._unrecorded.release()
        return True

    async def _attempts(
        self, claim: Claim, principal: Principal, line: lines.Line
    ) -> lines.Outcome | bool:
        """The line's outcome, tried again after a transient error; else whether it may count
        as done (True: the batch stops, the line ends unrun; False: it runs again later)."""
        job = claim.job
        for attempt in range(RETRIES):
            timeout_s = max(1.0, (job.expires_at - datetime.now(UTC)).total_seconds())
            try:
                return await lines.run(self._kiln, principal, line, timeout_s)
            except lines.TRANSIENT as exc:
                if claim.lost or attempt == RETRIES - 1:
                    log.warning("batch line not run", batch=str(job.id), line=line.n,
                                error=exc.code)  # fmt: skip
                    return False
                if claim.stopping():  # cancelled, expired, revoked: the line ends unrun
                    return True
                await asyncio.sleep(min(30.0, exc.retry_after or 2.0**attempt))
        return False

    async def _finalize(self, claim: Claim) -> None:
        """Write the output and error files and end the batch (completed, cancelled, expired)."""
        job = claim.job
        if claim.status == "in_progress":
            await self._move(claim, "finalizing", ("in_progress",), finalizing_at=func.now())
        final = {"cancelling": "cancelled", "finalizing": "completed"}.get(claim.status)
        if final is None:
            return
        if final == "completed" and claim.revoked:
            await self._unrun(job, "revoked", lines.revoked(job.principal))
        expired = final == "completed" and datetime.now(UTC) >= job.expires_at
        if expired and await self._unrun(job, "expired", lines.EXPIRED):
            final = "expired"  # lines were left when the window ended (else it completed)
        async with self._kiln.db.sessions() as session:
            rows = (await session.execute(
                select(BatchLine.ok, BatchLine.output).where(BatchLine.batch_id == job.id)
                .order_by(BatchLine.line)
            )).all()  # fmt: skip
        try:
            async with self._kiln.db.sessions.begin() as session:
                output, errors = await store_outputs(
                    self._kiln, session, job.tenant_id, public_id("batch_", job.id),
                    lines=[(ok, o) for ok, o in rows], expires_s=job.output_expires_s,
                )  # fmt: skip
                moved = await session.scalar(
                    update(BatchJob)
                    .where(BatchJob.id == job.id, BatchJob.lease_owner == self.owner)
                    .where(BatchJob.status.in_(("finalizing", "cancelling")))
                    .values(status=final, lease_until=None, **{f"{final}_at": func.now()},
                            output_file_id=output.id if output else None,
                            error_file_id=errors.id if errors else None)
                    .returning(BatchJob.id)
                )  # fmt: skip
                if moved is None:
                    raise _Lost
                await events.ended(session, job, final, output.id if output else None,
                                   errors.id if errors else None)  # fmt: skip
        except _Lost:
            log.warning("batch changed hands while finalizing", batch=str(job.id))
            await drop_unused(self._kiln, {f.digest for f in (output, errors) if f})
            return
        claim.status = final
        metrics.BATCHES_ENDED.labels(final).inc()


class _Lost(Exception):
    """The batch is no longer this runner's to finalize (its files are not kept)."""
