"""Recording batch lines on a real PostgreSQL, a group in one transaction: a line another run
recorded first gives this run's budget hold back at once and is not billed again; the others
of its group are recorded and billed; lines finishing apart share a group within the linger."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

from sqlalchemy import text

from kiln_platform.batches import lines
from kiln_platform.batches.recorder import LineRecorder
from kiln_platform.batches.tables import BatchJob, BatchLine
from kiln_platform.billing.ledger import LedgerWriter, Usage
from kiln_platform.billing.pricebooks import PriceBooks, create_book
from kiln_platform.billing.pricing import Quantities
from kiln_platform.billing.reservations import Budgets
from kiln_platform.billing.schemas import PriceBookCreate, PriceIn
from kiln_platform.db.database import Database
from kiln_platform.keys.services import Principal
from kiln_platform.quotas.enforcer import QuotaEnforcer
from tests.factories import CLI, make_tenant, resolved_version

EMB_PRICE = PriceBookCreate(
    prices=[PriceIn(model="emb", unit="input_token", unit_price_micros="3")],
    effective_from=datetime(2020, 1, 1, tzinfo=UTC),
)


async def _reserved(db: Database, tenant: uuid.UUID) -> int:
    async with db.sessions() as session:
        held = await session.scalar(
            text("SELECT coalesce(sum(reserved_micros), 0) FROM budget_periods"
                 " WHERE tenant_id = :t"), {"t": tenant}
        )  # fmt: skip
    return int(held or 0)


def _kiln(db: Database) -> SimpleNamespace:
    """What ``lines.record`` uses of the Kiln: the database, price books, budgets, ledger."""
    books = PriceBooks(db.sessions, 60.0)
    quotas = QuotaEnforcer(db.sessions, ttl=60.0, lease_ttl_s=60.0, timeout_s=60.0)
    budgets = Budgets(db.sessions, quotas, books, timeout_s=0.0, ttl_s=60.0)
    return SimpleNamespace(db=db, books=books, budgets=budgets,
                           ledger=LedgerWriter(db.sessions, books, retry_s=0.05))  # fmt: skip


async def test_a_line_recorded_before_gives_its_hold_back_its_group_is_recorded(
    db: Database,
) -> None:
    kiln = _kiln(db)
    budgets = kiln.budgets
    async with db.sessions.begin() as session:
        await create_book(session, CLI, EMB_PRICE)
        tenant = await make_tenant(session)
        await session.execute(
            text("INSERT INTO quotas (id, tenant_id, monthly_budget_micros) VALUES (:i, :t, :b)"),
            {"i": uuid.uuid4(), "t": tenant, "b": 10**9},
        )
        job = BatchJob(tenant_id=tenant, endpoint="/v1/embeddings", completion_window="24h",
                       status="in_progress", principal={},
                       expires_at=datetime.now(UTC) + timedelta(days=1))  # fmt: skip
        session.add(job)
        await session.flush()
        session.add(BatchLine(batch_id=job.id, custom_id="a", tenant_id=tenant, line=1, ok=True,
                              output="{}"))  # fmt: skip  # another run recorded it
    line = lines.Line(job.id, tenant, "/v1/embeddings", 1, "a", {})
    principal = Principal(tenant, None, frozenset({"inference"}))
    await budgets.reserve(principal, line.request_id, resolved_version("emb"),
                          Quantities(input_tokens=10**6, items=1))  # fmt: skip
    assert await _reserved(db, tenant) == 3 * 10**6
    budgets.handed(line.request_id)  # the line's sink took the usage
    usage = Usage(line.request_id, tenant, None, "emb", "1", "embeddings", 200, input_tokens=5)
    fresh = lines.Line(job.id, tenant, "/v1/embeddings", 2, "b", {})
    other = Usage(fresh.request_id, tenant, None, "emb", "1", "embeddings", 200, input_tokens=7)
    group = [(line, lines.Outcome(True, "{}", usage)), (fresh, lines.Outcome(True, "{}", other))]
    assert await lines.record(kiln, group) == [False, True]  # type: ignore[arg-type]
    assert await _reserved(db, tenant) == 0
    async with db.sessions() as session:
        billed = (await session.execute(text(
            "SELECT request_id, input_tokens FROM usage_events WHERE tenant_id = :t"
        ), {"t": tenant})).all()  # fmt: skip
        recorded = set(
            (
                await session.execute(
                    text("SELECT custom_id FROM batch_lines WHERE batch_id = :b"), {"b": job.id}
                )
            ).scalars()
        )
    assert [tuple(row) for row in billed] == [(fresh.request_id, 7)]  # one transaction, grouped
    assert recorded == {"a", "b"}


async def test_lines_finishing_within_the_linger_share_one_transaction(db: Database) -> None:
    kiln = _kiln(db)
    async with db.sessions.begin() as session:
        tenant = await make_tenant(session)
        job = BatchJob(tenant_id=tenant, endpoint="/v1/embeddings", completion_window="24h",
                       status="in_progress", principal={},
                       expires_at=datetime.now(UTC) + timedelta(days=1))  # fmt: skip
        session.add(job)
    recorder = LineRecorder(kiln, linger_s=0.3)  # type: ignore[arg-type]

    async def finish(n: int, after_s: float) -> bool:
        await asyncio.sleep(after_s)
        line = lines.Line(job.id, tenant, "/v1/embeddings", n, f"c{n}", {})
        usage = Usage(line.request_id, tenant, None, "emb", "1", "embeddings", 200, input_tokens=n)
        return await recorder.record(line, lines.Outcome(True, "{}", usage))

    recorded = await asyncio.gather(finish(1, 0.0), finish(2, 0.1), finish(3, 0.2))
    assert list(recorded) == [True, True, True]
    async with db.sessions() as session:
        xids = set((await session.execute(text(
            "SELECT xmin::text FROM batch_lines WHERE batch_id = :b"), {"b": job.id}
        )).scalars())  # fmt: skip
        billed = await session.scalar(
            text("SELECT count(*) FROM usage_events WHERE tenant_id = :t"), {"t": tenant}
        )
    assert len(xids) == 1  # one transaction for the three lines, 0.1 s apart
    assert billed == 3
    await recorder.stop()
