"""The usage ledger: one priced, immutable row per request, durable before the response.

Group commit: ``record`` queues a request's usage; a single flusher writes everything pending in
one transaction as soon as its previous write finished (no timer), and ``await commit(usage)``
returns once the batch holding it has committed. Handlers await it before answering; a stream
awaits it before its final chunk; a client that went away (499) is recorded without waiting.

One transaction per batch inserts the ``usage_events`` rows (``ON CONFLICT (request_id) DO
NOTHING RETURNING request_id``: exactly once, even if a batch is retried), the charge lines of the
rows actually inserted, priced with the price-book version in effect when the request was
recorded, and settles those rows' budget reservations. Once it has committed, the rows it
inserted are counted in the usage rollups the console overview reads (``rollup.Rollups``,
added to their tables every few seconds, outside this transaction).

If the database is unreachable, the batch goes to the usage spool instead (``billing.spool``: a
local file, fsync'd before its requests answer) and is written from there, exactly once, when the
database is back. Past the spool's bound, or when a write fails for another reason, every request
waiting on the batch fails with 503 instead of answering unbilled: the client learns it should
retry, and the row is kept and written (with status 503, unbilled) once the database is back. Rows
nobody waits on are retried as they are.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import structlog
from sqlalchemy import ARRAY, bindparam, func, insert, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.exc import DataError, IntegrityError

from kiln_platform.billing.budgets import Settled, settle
from kiln_platform.billing.pricing import PriceList, Quantities, book_at, charges, cost
from kiln_platform.billing.tables import UsageCharge
from kiln_platform.db.outage import unreachable
from kiln_platform.db.tables import UsageEvent
from kiln_platform.errors import ServiceUnavailable

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

    from kiln_platform.billing.pricebooks import PriceBooks
    from kiln_platform.billing.rollup import Rollups
    from kiln_platform.billing.spool import UsageSpool
    from kiln_platform.keys.services import Principal
    from kiln_platform.registry.services import ResolvedVersion

log = structlog.get_logger("kiln.ledger")
EVENTS = UsageEvent.metadata.tables["usage_events"]
CHARGES = UsageCharge.metadata.tables["usage_charges"]
_NOT_COLUMNS = ("plan", "timezone", "at", "held", "batch")


def billed(status: int) -> bool:
    """Whether a request with this status is charged: successes, and what a client that went
    away (499) consumed. Any other error is recorded with cost 0."""
    return status < 400 or status == 499


@dataclass(frozen=True, slots=True)
class Usage:
    """What one request consumed, and who pays for it."""

    request_id: str
    tenant_id: uuid.UUID
    api_key_id: uuid.UUID | None
    model: str
    version: str
    endpoint: str
    status: int
    input_tokens: int = 0
    output_tokens: int = 0
    items: int = 0
    queue_ms: float = 0.0
    compute_ms: float = 0.0
    oauth_client_id: uuid.UUID | None = None
    adapter: str | None = None
    plan: str = "standard"
    timezone: str = "UTC"
    at: datetime = field(default_factory=lambda: datetime.now(UTC))
    held: bool = True
    """Whether a budget reservation may exist for it (its admission knows; else assume so)."""
    batch: bool = False
    """A Batches API line: the price book's batch discount applies."""


def usage_of(
    principal: Principal,
    version: ResolvedVersion,
    request_id: str,
    endpoint: str,
    *,
    status: int = 200,
    input_tokens: int = 0,
    output_tokens: int = 0,
    items: int = 0,
    queue_ms: float = 0.0,
    compute_ms: float = 0.0,
    adapter: str | None = None,
) -> Usage:
    """A request's usage, from the caller and the model version (and adapter) that served it."""
    return Usage(
        request_id=request_id,
        tenant_id=principal.tenant_id,
        api_key_id=principal.key_id,
        model=version.model,
        version=version.version,
        endpoint=endpoint,
        status=status,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        items=items,
        queue_ms=queue_ms,
        compute_ms=compute_ms,
        oauth_client_id=principal.oauth_client_id,
        adapter=adapter,
        plan=principal.plan,
        timezone=principal.timezone,
    )


def priced(usage: Usage, book: PriceList | None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The ``usage_events`` row of a request and its ``usage_charges`` lines."""
    used = Quantities(
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        items=usage.items,
        compute_ms=usage.compute_ms,
    )
    lines = []
    if billed(usage.status):
        lines = charges(book, usage.model, usage.version, usage.plan, used, batch=usage.batch)
    list_cost, effective = cost(lines)
    currency = book.currency if book else "USD"
    version = book.version if book else None
    event = {
        f.name: getattr(usage, f.name)
        for f in dataclasses.fields(usage)
        if f.name not in _NOT_COLUMNS
    }
    event.update(created_at=usage.at, price_book_version=version, currency=currency,
                 list_cost_micros=list_cost, cost_micros=effective)  # fmt: skip
    who = {k: event[k] for k in ("request_id", "tenant_id", "api_key_id", "oauth_client_id",
                                 "model", "version", "adapter")}  # fmt: skip
    rows = [
        {**who, "unit": c.unit, "quantity": c.quantity, "unit_price_micros": c.unit_price_micros,
         "list_cost_micros": c.list_cost_micros, "cost_micros": c.cost_micros,
         "currency": currency, "price_book_version": version, "charged_at": usage.at}
        for c in lines
    ]  # fmt: skip
    return event, rows


EVENT_COLUMNS = tuple(c.name for c in EVENTS.columns if c.name != "id")
LINE_COLUMNS = ("request_id", "tenant_id", "api_key_id", "oauth_client_id", "model", "version",
                "adapter", "unit", "quantity", "unit_price_micros", "list_cost_micros",
                "cost_micros", "currency", "price_book_version", "charged_at")  # fmt: skip


def _arrays(table: Any, columns: tuple[str, ...], prefix: str) -> Any:
    """``SELECT unnest(:<prefix><column>), …``: rows passed as one array per column."""
    return select(*(
        func.unnest(bindparam(prefix + n, type_=ARRAY(table.c[n].type))).label(n) for n in columns
    ))  # fmt: skip


_INSERTED = (
    pg_insert(EVENTS)
    .from_select(EVENT_COLUMNS, _arrays(EVENTS, EVENT_COLUMNS, "e_"))
    .on_conflict_do_nothing(index_elements=["request_id"])
    .returning(EVENTS.c.request_id)
    .cte("inserted")
)
_LINES = _arrays(CHARGES, LINE_COLUMNS, "l_").subquery("line")
WRITE = select(_INSERTED.c.request_id).add_cte(
    insert(CHARGES)
    .from_select(
        LINE_COLUMNS,
        select(*_LINES.c).where(_LINES.c.request_id.in_(select(_INSERTED.c.request_id))),
    )
    .cte("charged")
)
"""A batch in one statement: its ``usage_events`` rows (a column an array, so the statement is
the same for any batch size, prepared once), and the charge lines of the rows it inserted (a
duplicate request id adds neither). The charge rollups' statement triggers (migrations 0023,
0025) then run once a batch, upserting their rows in key order: as a statement a line they cost
a quarter of the ledger's throughput, and two flushers upserting the same rows in other orders
deadlocked (bench/ledger_triggers.py, docs/benchmarks.md). One statement instead of two is a
round trip less for a lone request (bench/ledger_flush.py)."""


def _columns(rows: list[dict[str, Any]], columns: tuple[str, ...], prefix: str) -> dict[str, Any]:
    return {prefix + n: [row[n] for row in rows] for n in columns}


async def write(
    session: AsyncSession, usages: list[Usage], books: list[PriceList]
) -> list[dict[str, Any]]:
    """Insert a batch in the caller's transaction; returns the usage rows actually inserted."""
    unique: dict[str, Usage] = {}
    for u in usages:
        unique.setdefault(u.request_id, u)
    priced_rows = {rid: priced(u, book_at(books, u.at)) for rid, u in unique.items()}
    events = [event for event, _ in priced_rows.values()]
    lines = [line for _, rows in priced_rows.values() for line in rows]
    params = _columns(events, EVENT_COLUMNS, "e_") | _columns(lines, LINE_COLUMNS, "l_")
    inserted = set(await session.scalars(WRITE, params))
    done = [u for rid, u in unique.items() if rid in inserted]
    settled = [
        Settled(u.request_id, u.tenant_id, u.timezone, priced_rows[u.request_id][0]["cost_micros"],
                u.at, u.held)
        for u in done
    ]  # fmt: skip
    await settle(session, settled)
    return [priced_rows[u.request_id][0] for u in done]


class LedgerWriter:
    """Group-commits usage rows; ``enabled=False`` (``KILN_METERING=0``) records nothing."""

    def __init__(
        self, sessions: async_sessionmaker[AsyncSession], books: PriceBooks | None = None, *,
        enabled: bool = True, retry_s: float = 0.5, rollups: Rollups | None = None,
        spool: UsageSpool[Usage] | None = None,
    ) -> None:  # fmt: skip
        self._sessions = sessions
        self.spool = spool
        """Where batches go while the database is unreachable (None: they answer 503)."""
        self._rollups = rollups
        """Where the committed rows are counted for the overview (None: nowhere)."""
        self._books = books
        self.enabled = enabled
        self._retry_s = retry_s
        self._pending: list[Usage] = []
        self._waiters: dict[str, asyncio.Future[None]] = {}
        self._wake = asyncio.Event()
        self._stopping = False
        self._task: asyncio.Task[None] | None = None

    def record(self, usage: Usage) -> None:
        """Queue a request's usage without waiting for it to be written."""
        if self.enabled:
            self._pending.append(usage)
            self._wake.set()

    async def commit(self, usage: Usage) -> None:
        """Queue a request's usage and return once it is durable; 503 if it cannot be written.

        Cancelling the caller does not cancel the write.
        """
        if not self.enabled:
            return
        done = self._waiters[usage.request_id] = asyncio.get_running_loop().create_future()
        self.record(usage)
        try:
            await asyncio.shield(done)
        except LedgerUnavailable:
            raise ServiceUnavailable(
                "Kiln could not record this request's usage; it was not billed. Retry shortly.",
                retry_after=1.0,
            ) from None

    def degraded(self) -> bool:
        """Whether requests can be served with the database unreachable: usage goes to the
        spool, within its bound (readiness reports this as degraded, not down)."""
        return self.spool is not None and self.spool.accepts()

    async def start(self) -> None:
        """Start the flusher (and the rollups' task)."""
        self._task = asyncio.create_task(self._loop(), name="ledger-writer")
        if self._rollups is not None:
            await self._rollups.start()

    async def stop(self, grace_s: float = 10.0) -> None:
        """Write what is pending (for up to ``grace_s`` seconds), then stop the flusher."""
        self._stopping = True
        self._wake.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(self._task, grace_s)
            except TimeoutError:
                log.error("ledger stopped with unwritten usage", rows=len(self._pending))
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._rollups is not None:  # after the last rows: they are counted too
            await self._rollups.stop()

    async def _loop(self) -> None:
        while self._pending or not self._stopping:
            spooled = self.spool is not None and self.spool.pending()
            with contextlib.suppress(TimeoutError):  # with a spool to drain: try every second
                await asyncio.wait_for(self._wake.wait(), 1.0 if spooled else None)
            self._wake.clear()
            if self._pending:
                rows, self._pending = self._pending, []
                await self._flush(rows)
            if spooled:
                await self._drain()

    async def _flush(self, rows: list[Usage]) -> None:
        try:
            await self._write(rows)
        except (IntegrityError, DataError):  # a row the database refuses: find it, keep the rest
            for row in rows:
                await self._flush_one(row)
        except Exception as exc:
            if unreachable(exc) and await self._spooled(rows):
                return
            log.exception("ledger write failed; waiting requests answer 503", rows=len(rows))
            self._pending[:0] = [self._failed(r) for r in rows]
            await asyncio.sleep(self._retry_s)
            self._wake.set()

    async def _spooled(self, rows: list[Usage]) -> bool:
        """Keep a batch in the spool and answer its requests; False past the spool's bound."""
        spool = self.spool
        if spool is None or not spool.accepts():
            return False
        if not spool.pending():
            log.warning("database unreachable: usage spooled to local disk", path=str(spool.path))
        try:
            await asyncio.to_thread(spool.append, rows)
        except OSError:
            log.exception("usage spool write failed; waiting requests answer 503")
            return False
        self._answer(rows)
        return True

    async def _drain(self) -> None:
        """Write the spooled rows once the database is back (exactly once: by request id)."""
        assert self.spool is not None
        try:
            inserted = await self.spool.drain(self._write_spooled)
        except Exception as exc:
            if not unreachable(exc):
                log.exception("draining the usage spool failed; will retry")
            return
        log.warning("database back: usage spool written", inserted=inserted)

    async def _write_spooled(self, rows: list[Usage]) -> int:
        async with self._sessions.begin() as session:
            inserted = await self.write_in(session, rows)
        self.counted(inserted)
        return len(inserted)

    async def _flush_one(self, row: Usage) -> None:
        try:
            await self._write([row])
        except (IntegrityError, DataError):
            log.exception("usage row refused by the database; dropped", request_id=row.request_id)
            self._failed(row)
        except Exception:
            self._pending.append(self._failed(row))
            self._wake.set()

    async def write_in(self, session: AsyncSession, rows: list[Usage]) -> list[dict[str, Any]]:
        """Write usage rows and their charges in the caller's transaction (``write`` at the
        current prices); the rows inserted, for ``counted`` once it has committed."""
        books = await self._books.all() if self._books is not None else []
        return await write(session, rows, books)

    def counted(self, inserted: list[dict[str, Any]]) -> None:
        """Count committed rows in the overview's rollups."""
        if self._rollups is not None and inserted:
            self._rollups.add(inserted)

    async def _write(self, rows: list[Usage]) -> None:
        async with self._sessions.begin() as session:
            inserted = await self.write_in(session, rows)
        self.counted(inserted)
        self._answer(rows)

    def _answer(self, rows: list[Usage]) -> None:
        """Release the requests waiting on rows now durable."""
        for row in rows:
            done = self._waiters.pop(row.request_id, None)
            if done is not None and not done.done():
                done.set_result(None)

    def _failed(self, usage: Usage) -> Usage:
        """Fail the request waiting on a row; a row kept for retry is then recorded as what its
        request answered (503, unbilled)."""
        done = self._waiters.pop(usage.request_id, None)
        if done is None:
            return usage
        if not done.done():
            done.set_exception(LedgerUnavailable())
            done.exception()  # retrieved: its waiter may be gone
        return dataclasses.replace(usage, status=503)


class LedgerUnavailable(Exception):
    """The batch could not be written."""
