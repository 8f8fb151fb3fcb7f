"""The usage ledger on a real PostgreSQL: priced rows and charge lines written exactly once,
durable when ``commit`` returns, group-committed, and failures answered with 503."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import text

from kiln_platform.admin.authz import Actor, Role
from kiln_platform.billing.ledger import LedgerWriter, Usage, write
from kiln_platform.billing.pricebooks import PriceBooks, create_book
from kiln_platform.billing.schemas import PriceBookCreate, PriceIn
from kiln_platform.db.database import Database
from kiln_platform.db.engine import asyncpg_url, create_engine, writer_engine, writer_sessions
from kiln_platform.errors import ServiceUnavailable
from kiln_platform.tenants.services import insert_tenant

CLI = Actor("cli:test", Role.PLATFORM_ADMIN, None)
EPOCH = datetime(2020, 1, 1, tzinfo=UTC)
LATER = datetime(2031, 1, 1, tzinfo=UTC)


@pytest.fixture(scope="module", autouse=True)
async def _price_books(db: Database) -> None:
    async with db.sessions.begin() as session:
        await create_book(session, CLI, _book(EPOCH, input_price="0.5", discount=2500))
        await create_book(session, CLI, _book(LATER, input_price="1", discount=0))


def _book(when: datetime, *, input_price: str, discount: int) -> PriceBookCreate:
    return PriceBookCreate(
        prices=[
            PriceIn("m", "input_token", input_price),
            PriceIn("m", "output_token", "2"),
            PriceIn("*", "request", "100"),
            PriceIn("m", "compute_second", "1000"),
        ],
        effective_from=when,
        discounts={"pro": discount},
    )


@contextlib.asynccontextmanager
async def _ledger(db: Database, sessions: Any = None) -> AsyncIterator[LedgerWriter]:
    ledger = LedgerWriter(sessions or db.sessions, PriceBooks(db.sessions, ttl=60), retry_s=0.05)
    await ledger.start()
    try:
        yield ledger
    finally:
        await ledger.stop()


async def _tenant(db: Database, plan: str = "pro") -> uuid.UUID:
    async with db.sessions.begin() as session:
        tenant = await insert_tenant(session, f"l-{uuid.uuid4().hex[:8]}")
        await session.execute(
            text("UPDATE tenants SET plan = :p, timezone = 'Asia/Tokyo' WHERE id = :t"),
            {"p": plan, "t": tenant.id},
        )
    return tenant.id


def _usage(tenant: uuid.UUID, status: int = 200, **kw: Any) -> Usage:
    fields: dict[str, Any] = {
        "input_tokens": 3, "output_tokens": 5, "compute_ms": 1.5, "plan": "pro",
        "timezone": "Asia/Tokyo", **kw,
    }  # fmt: skip
    return Usage(f"req_{uuid.uuid4().hex}", tenant, None, "m", "1", "chat.completions", status,
                 **fields)  # fmt: skip


async def _rows(db: Database, sql: str, **params: Any) -> list[Any]:
    async with db.sessions() as session:
        return list((await session.execute(text(sql), params)).all())


async def test_commit_prices_with_the_plan_discount_and_is_durable_on_return(db: Database) -> None:
    tenant = await _tenant(db)
    usage = _usage(tenant)
    async with _ledger(db) as ledger:
        await ledger.commit(usage)
        # no stop/flush needed: the row is there as soon as commit returned
        events = await _rows(
            db,
            "SELECT status, price_book_version, currency, list_cost_micros, cost_micros"
            " FROM usage_events WHERE request_id = :r",
            r=usage.request_id,
        )
    # input 3 x 0.5 = 1.5 -> 2 (list), 1.125 -> 1; output 10 -> 10, 7.5 -> 8;
    # request 100 -> 100, 75; compute 0.0015 s x 1000 = 1.5 -> 2, 1.125 -> 1
    assert events == [(200, 1, "USD", 114, 85)]
    lines = await _rows(
        db,
        "SELECT unit, quantity, list_cost_micros, cost_micros FROM usage_charges"
        " WHERE request_id = :r ORDER BY unit",
        r=usage.request_id,
    )
    assert [(u, str(q.normalize()), lc, c) for u, q, lc, c in lines] == [
        ("compute_second", "0.0015", 2, 1),
        ("input_token", "3", 2, 1),
        ("output_token", "5", 10, 8),
        ("request", "1", 100, 75),
    ]
    spent = await _rows(
        db, "SELECT spent_micros FROM budget_periods WHERE tenant_id = :t", t=tenant
    )
    assert spent == [(85,)]


async def test_a_request_id_is_recorded_once_with_one_set_of_lines(db: Database) -> None:
    tenant = await _tenant(db)
    usage = _usage(tenant)
    async with _ledger(db) as ledger:
        ledger.record(usage)
        ledger.record(usage)  # twice in one batch
        await ledger.commit(usage)  # and again in a later one
        await ledger.commit(dataclasses.replace(usage, output_tokens=99))  # a retry's
    assert await _rows(
        db, "SELECT count(*) FROM usage_events WHERE request_id = :r", r=usage.request_id
    ) == [(1,)]
    assert await _rows(
        db, "SELECT count(*) FROM usage_charges WHERE request_id = :r", r=usage.request_id
    ) == [(4,)]
    assert await _rows(
        db, "SELECT output_tokens FROM usage_events WHERE request_id = :r", r=usage.request_id
    ) == [(5,)]
    assert await _rows(
        db, "SELECT spent_micros FROM budget_periods WHERE tenant_id = :t", t=tenant
    ) == [(85,)]


async def test_errors_are_recorded_unbilled_and_abandoned_streams_billed(db: Database) -> None:
    tenant = await _tenant(db)
    failed, cut = _usage(tenant, status=500), _usage(tenant, status=499, output_tokens=1)
    async with _ledger(db) as ledger:
        ledger.record(failed)
        await ledger.commit(cut)
    rows = await _rows(
        db,
        "SELECT e.status, e.input_tokens, e.cost_micros, count(c.id) FROM usage_events e"
        " LEFT JOIN usage_charges c USING (request_id) WHERE e.tenant_id = :t"
        " GROUP BY e.status, e.input_tokens, e.cost_micros ORDER BY e.status",
        t=tenant,
    )
    # 499: input 1 + output 2 x 0.75 = 1.5 -> 2 + request 75 + compute 1
    assert rows == [(499, 3, 1 + 2 + 75 + 1, 4), (500, 3, 0, 0)]


async def test_the_price_book_in_effect_when_recorded_applies(db: Database) -> None:
    tenant = await _tenant(db)
    now, later = _usage(tenant), _usage(tenant, at=LATER + timedelta(days=1))
    async with _ledger(db) as ledger:
        await asyncio.gather(ledger.commit(now), ledger.commit(later))
    rows = await _rows(
        db,
        "SELECT price_book_version, cost_micros FROM usage_events WHERE tenant_id = :t"
        " ORDER BY price_book_version",
        t=tenant,
    )
    # version 2: input 3 x 1 = 3, no discount: 3 + 10 + 100 + 2 (1.5 -> 2)
    assert rows == [(1, 85), (2, 115)]


async def test_concurrent_commits_share_a_few_transactions(db: Database) -> None:
    tenant = await _tenant(db)
    usages = [_usage(tenant) for _ in range(300)]
    async with _ledger(db) as ledger:
        await ledger.commit(_usage(tenant))  # price books loaded
        before = await _commits(db)
        await asyncio.gather(*(ledger.commit(u) for u in usages))
        after = await _commits(db)
        count = await _rows(db, "SELECT count(*) FROM usage_events WHERE tenant_id = :t", t=tenant)
    assert count == [(301,)]
    # 10+ commits a transaction on average; the count includes any other session on the
    # database, and a loaded machine spreads the arrivals (13 seen in one full run)
    assert after - before <= 30, f"{after - before} transactions for 300 commits"


async def _commits(db: Database) -> int:
    rows = await _rows(
        db, "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
    )
    async with db.sessions() as session:
        await session.execute(text("SELECT pg_stat_clear_snapshot()"))
    return int(rows[0][0])


async def test_a_row_the_database_refuses_fails_only_its_request(db: Database) -> None:
    tenant = await _tenant(db)
    good, bad = _usage(tenant), _usage(uuid.uuid4())  # no such tenant: foreign key violation
    async with _ledger(db) as ledger:
        results = await asyncio.gather(
            ledger.commit(good), ledger.commit(bad), return_exceptions=True
        )
    assert results[0] is None
    assert isinstance(results[1], ServiceUnavailable)
    assert await _rows(
        db, "SELECT request_id FROM usage_events WHERE request_id IN (:g, :b)",
        g=good.request_id, b=bad.request_id,
    ) == [(good.request_id,)]  # fmt: skip


class _FlakySessions:
    """Sessions whose first ``failures`` transactions cannot reach the database."""

    def __init__(self, db: Database, failures: int) -> None:
        self._db, self.failures = db, failures

    def __call__(self) -> Any:
        return self._db.sessions()

    def begin(self) -> Any:
        if self.failures > 0:
            self.failures -= 1
            raise ConnectionRefusedError("database unreachable")
        return self._db.sessions.begin()


async def test_an_unreachable_database_answers_503_and_records_it_unbilled(db: Database) -> None:
    tenant = await _tenant(db)
    usage = _usage(tenant)
    async with _ledger(db, _FlakySessions(db, failures=1)) as ledger:
        with pytest.raises(ServiceUnavailable):
            await ledger.commit(usage)
    rows = await _rows(
        db, "SELECT status, cost_micros FROM usage_events WHERE request_id = :r",
        r=usage.request_id,
    )  # fmt: skip
    assert rows == [(503, 0)]


COUNTER = [
    "CREATE TABLE line_statements (n int)",
    "CREATE FUNCTION count_line_statement() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER"
    " AS $$ BEGIN INSERT INTO line_statements VALUES (1); RETURN NULL; END $$",
    "CREATE TRIGGER count_line_statements AFTER INSERT ON usage_charges FOR EACH STATEMENT"
    " EXECUTE FUNCTION count_line_statement()",
]


async def test_a_batch_s_lines_are_one_statement(db: Database, database_uri: str) -> None:
    """The charge rollups' statement triggers run once a batch, not once a line: as a
    statement a line they cost a quarter of the ledger's throughput, and two flushers
    upserting the same rollup rows in other orders deadlocked (bench/ledger_triggers.py).
    Events and lines are one statement for any batch size (past the 1,000 rows a statement
    once took), and a row already written adds no line."""
    tenant = await _tenant(db)
    early = _usage(tenant)
    async with db.sessions.begin() as session:
        await write(session, [early], [])
    owner = create_engine(asyncpg_url(database_uri), pool_size=1)
    async with owner.begin() as conn:
        for sql in COUNTER:
            await conn.execute(text(sql))
    try:
        async with db.sessions.begin() as session:
            written = await write(session, [_usage(tenant) for _ in range(1200)] + [early], [])
        lines = await _rows(db, "SELECT count(*) FROM usage_charges WHERE tenant_id = :t", t=tenant)
        async with owner.connect() as conn:
            statements = await conn.scalar(text("SELECT count(*) FROM line_statements"))
    finally:
        async with owner.begin() as conn:
            await conn.execute(text("DROP TRIGGER count_line_statements ON usage_charges"))
            await conn.execute(text("DROP FUNCTION count_line_statement()"))
            await conn.execute(text("DROP TABLE line_statements"))
        await owner.dispose()
    assert len(written) == 1200
    assert lines == [(4 * 1201,)]  # input, output, compute and request lines of each
    assert statements == 1


async def test_the_ledger_connection_may_commit_without_waiting_for_the_disk(
    db: Database,
) -> None:
    """``KILN_LEDGER_SYNCHRONOUS_COMMIT=false`` reaches the ledger's one connection in its
    start-up packet (the suite's server runs without fsync anyway: the source shows who set it)."""
    query = text("SELECT setting, source FROM pg_settings WHERE name = 'synchronous_commit'")
    shown = []
    for synchronous in (True, False):
        engine = writer_engine(db.engine, synchronous_commit=synchronous)
        try:
            async with engine.connect() as conn:
                shown.append(tuple((await conn.execute(query)).one()))
        finally:
            await engine.dispose()
    assert shown[0][1] != "client"
    assert shown[1] == ("off", "client")


async def test_the_ledger_connection_is_platform_scoped_from_its_start_up_packet(
    db: Database,
) -> None:
    """The ledger's transactions declare no scope (a round trip each): its one connection
    carries ``kiln.scope`` from its start-up packet, so row-level security lets it write every
    tenant's rows; a connection without it is scoped to nothing."""
    tenant = await _tenant(db)
    scopes = []
    for scoped in (False, True):
        engine = writer_engine(db.engine, db.set_role, platform_scope=scoped)
        try:
            async with writer_sessions(engine).begin() as session:
                scopes.append(
                    await session.scalar(text("SELECT current_setting('kiln.scope', true)"))
                )
            if scoped:
                async with _ledger(db, writer_sessions(engine)) as ledger:
                    usage = _usage(tenant)
                    await asyncio.wait_for(ledger.commit(usage), 10)
        finally:
            await engine.dispose()
    assert scopes[0] in (None, "")
    assert scopes[1] == "platform"
    written = await _rows(
        db, "SELECT status FROM usage_events WHERE request_id = :r", r=usage.request_id
    )
    assert written == [(200,)]
