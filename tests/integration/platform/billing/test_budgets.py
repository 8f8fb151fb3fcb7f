"""Budget reservations on a real PostgreSQL: reserve, settle, release, expiry, thresholds, and
the race of many concurrent requests for one budget."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, date, datetime, timedelta

import pytest
from sqlalchemy import event, text

from kiln_platform.admin.authz import Actor, Role
from kiln_platform.billing.budgets import Settled, settle
from kiln_platform.billing.pricebooks import PriceBooks, create_book
from kiln_platform.billing.pricing import Quantities
from kiln_platform.billing.reservations import Budgets
from kiln_platform.billing.schemas import PriceBookCreate, PriceIn
from kiln_platform.db.database import Database
from kiln_platform.errors import Conflict, QuotaExceeded
from kiln_platform.keys.services import Principal
from kiln_platform.quotas.enforcer import QuotaEnforcer
from kiln_platform.registry.services import ResolvedVersion
from kiln_platform.tenants.services import insert_tenant
from tests.factories import resolved_version

CLI = Actor("cli:test", Role.PLATFORM_ADMIN, None)
# emb: 3 per input token + 10 per request; chat: 1 per input token, 2 per output token.
PRICES = [
    PriceIn(model="emb", unit="input_token", unit_price_micros="3"),
    PriceIn(model="emb", unit="request", unit_price_micros="10"),
    PriceIn(model="chat", unit="input_token", unit_price_micros="1"),
    PriceIn(model="chat", unit="output_token", unit_price_micros="2"),
]


EMB, CHAT = resolved_version("emb"), resolved_version("chat")


@pytest.fixture(scope="module", autouse=True)
async def _prices(db: Database) -> None:
    async with db.sessions.begin() as session:
        start = datetime(2020, 1, 1, tzinfo=UTC)
        await create_book(session, CLI, PriceBookCreate(prices=PRICES, effective_from=start))


def _budgets(db: Database, ttl_s: float = 60.0) -> Budgets:
    quotas = QuotaEnforcer(db.sessions, ttl=60.0, lease_ttl_s=60.0, timeout_s=60.0)
    return Budgets(db.sessions, quotas, PriceBooks(db.sessions, 60.0), timeout_s=0.0, ttl_s=ttl_s)


async def _tenant(
    db: Database,
    budget: int | None = None,
    timezone: str = "UTC",
    alerts: tuple[int, ...] = (50, 80, 100),
) -> Principal:
    async with db.sessions.begin() as session:
        tenant = await insert_tenant(session, f"b-{uuid.uuid4().hex[:8]}")
        if budget is not None:
            await session.execute(
                text(
                    "INSERT INTO quotas (id, tenant_id, monthly_budget_micros, "
                    "budget_alert_percents) VALUES (:i, :t, :b, :a)"
                ),
                {"i": uuid.uuid4(), "t": tenant.id, "b": budget, "a": list(alerts)},
            )
    return Principal(tenant.id, None, frozenset({"inference"}), timezone=timezone)


async def _period(db: Database, principal: Principal) -> tuple[int, int]:
    """(spent, reserved) of the tenant's periods, summed."""
    async with db.sessions() as session:
        row = (
            await session.execute(
                text(
                    "SELECT coalesce(sum(spent_micros), 0), coalesce(sum(reserved_micros), 0)"
                    " FROM budget_periods WHERE tenant_id = :t"
                ),
                {"t": principal.tenant_id},
            )
        ).one()
    return int(row[0]), int(row[1])


def _rid() -> str:
    return f"req_{uuid.uuid4().hex}"


async def _one_held(
    db: Database, version: ResolvedVersion, most: Quantities
) -> tuple[Budgets, Principal, str]:
    """A tenant with a budget of 1000 and one request holding ``most``."""
    budgets, principal, rid = _budgets(db), await _tenant(db, budget=1000), _rid()
    await budgets.reserve(principal, rid, version, most)
    return budgets, principal, rid


async def test_the_worst_case_is_held_and_what_does_not_fit_is_refused(db: Database) -> None:
    budgets = _budgets(db)
    principal = await _tenant(db, budget=100)
    await budgets.reserve(principal, _rid(), EMB, Quantities(input_tokens=20, items=1))  # 70
    assert await _period(db, principal) == (0, 70)
    with pytest.raises(QuotaExceeded) as refused:
        await budgets.reserve(principal, _rid(), EMB, Quantities(input_tokens=7, items=1))  # 31
    assert refused.value.code == "insufficient_quota"
    assert refused.value.status_code == 429
    assert 0 < (refused.value.retry_after or 0) <= 31 * 86400
    assert await _period(db, principal) == (0, 70)
    await budgets.reserve(principal, _rid(), EMB, Quantities(input_tokens=6, items=1))  # 28
    assert await _period(db, principal) == (0, 98)


async def test_chat_holds_max_tokens_and_settles_to_the_actual_cost(db: Database) -> None:
    most = Quantities(input_tokens=10, output_tokens=200)
    budgets, principal, rid = await _one_held(db, CHAT, most)
    assert await _period(db, principal) == (0, 410)
    budgets.handed(rid)  # the ledger has it: the end of the response releases nothing
    await budgets.finish(rid)
    assert await _period(db, principal) == (0, 410)
    async with db.sessions.begin() as session:  # 10 in, 7 out
        await settle(session, [Settled(rid, principal.tenant_id, "UTC", 24, datetime.now(UTC))])
    assert await _period(db, principal) == (24, 0)


async def test_a_request_the_ledger_never_got_is_released_at_the_end(db: Database) -> None:
    budgets, principal, rid = await _one_held(db, EMB, Quantities(input_tokens=10, items=1))
    assert await _period(db, principal) == (0, 40)
    await budgets.finish(rid)
    assert await _period(db, principal) == (0, 0)
    await budgets.finish(rid)  # once only
    assert await _period(db, principal) == (0, 0)


async def test_expired_holds_are_swept_once(db: Database) -> None:
    left_behind = _budgets(db, ttl_s=-1.0)  # a process that was killed holding these
    principal = await _tenant(db, budget=1000)
    for _ in range(3):
        await left_behind.reserve(principal, _rid(), EMB, Quantities(input_tokens=10, items=1))
    assert await _period(db, principal) == (0, 120)
    sweepers = [_budgets(db), _budgets(db)]
    swept = await asyncio.gather(*(s.sweep() for s in sweepers))
    assert sum(swept) >= 3
    assert await _period(db, principal) == (0, 0)


async def test_fifty_concurrent_requests_for_a_budget_of_ten(db: Database) -> None:
    principal = await _tenant(db, budget=10 * 40)
    processes = [_budgets(db) for _ in range(5)]  # five gateways, one period row

    async def one(i: int) -> bool:
        try:
            await processes[i % 5].reserve(
                principal, _rid(), EMB, Quantities(input_tokens=10, items=1)
            )
        except QuotaExceeded:
            return False
        return True

    admitted = await asyncio.gather(*(one(i) for i in range(50)))
    assert sum(admitted) == 10
    assert await _period(db, principal) == (0, 400)


async def test_a_request_id_in_flight_cannot_hold_twice(db: Database) -> None:
    budgets, principal, rid = await _one_held(db, EMB, Quantities(input_tokens=10, items=1))
    with pytest.raises(Conflict):
        await budgets.reserve(principal, rid, EMB, Quantities(input_tokens=10, items=1))
    assert await _period(db, principal) == (0, 40)


async def test_a_tenant_without_a_budget_costs_no_query(db: Database) -> None:
    budgets = _budgets(db)
    principal = await _tenant(db)
    await budgets.reserve(principal, _rid(), EMB, Quantities(input_tokens=10, items=1))  # warm
    statements: list[str] = []

    def count(*args: object) -> None:
        statements.append(str(args[2]))

    event.listen(db.engine.sync_engine, "before_cursor_execute", count)
    try:
        for _ in range(5):
            await budgets.reserve(principal, _rid(), EMB, Quantities(input_tokens=10, items=1))
    finally:
        event.remove(db.engine.sync_engine, "before_cursor_execute", count)
    assert statements == []


async def test_settling_spends_in_the_month_of_the_tenant_zone(db: Database) -> None:
    principal = await _tenant(db, budget=1000, timezone="Pacific/Auckland")
    when = datetime(2026, 3, 31, 12, 30, tzinfo=UTC)  # already 1 April in Auckland
    async with db.sessions.begin() as session:
        rows = [Settled(_rid(), principal.tenant_id, principal.timezone, 300, when)]
        await settle(session, rows)
    async with db.sessions() as session:
        got = (
            await session.execute(
                text("SELECT period, spent_micros FROM budget_periods WHERE tenant_id = :t"),
                {"t": principal.tenant_id},
            )
        ).all()
    assert [tuple(r) for r in got] == [(date(2026, 4, 1), 300)]


async def test_thresholds_are_recorded_once_each(db: Database) -> None:
    principal = await _tenant(db, budget=1000, alerts=(25, 50, 90))
    now = datetime.now(UTC)

    async def spend(amount: int) -> None:
        async with db.sessions.begin() as session:
            await settle(session, [Settled(_rid(), principal.tenant_id, "UTC", amount, now)])

    await spend(100)
    await spend(200)  # 300: 25 crossed
    await spend(300)  # 600: 50 crossed
    await spend(10)
    await spend(400)  # 1010: 90 crossed (over budget by settlement: recorded, never refused)
    async with db.sessions() as session:
        got = (
            await session.execute(
                text(
                    "SELECT threshold_percent, spent_micros, limit_micros FROM budget_events"
                    " WHERE tenant_id = :t ORDER BY threshold_percent"
                ),
                {"t": principal.tenant_id},
            )
        ).all()
    assert [tuple(r) for r in got] == [(25, 300, 1000), (50, 600, 1000), (90, 1010, 1000)]


async def test_a_hold_made_before_midnight_is_released_from_its_own_month(db: Database) -> None:
    _, principal, rid = await _one_held(db, EMB, Quantities(input_tokens=10, items=1))
    next_month = datetime.now(UTC).replace(day=28) + timedelta(days=5)
    async with db.sessions.begin() as session:
        await settle(session, [Settled(rid, principal.tenant_id, "UTC", 40, next_month)])
    async with db.sessions() as session:
        got = (
            await session.execute(
                text(
                    "SELECT spent_micros, reserved_micros FROM budget_periods"
                    " WHERE tenant_id = :t ORDER BY period"
                ),
                {"t": principal.tenant_id},
            )
        ).all()
    assert [tuple(r) for r in got] == [(0, 0), (40, 0)]


async def test_settling_what_cost_and_held_nothing_runs_no_statement(db: Database) -> None:
    principal = await _tenant(db)
    now = datetime.now(UTC)
    free = Settled(_rid(), principal.tenant_id, "UTC", 0, now, held=False)
    statements: list[str] = []

    def count(*args: object) -> None:
        statements.append(str(args[2]))

    event.listen(db.engine.sync_engine, "before_cursor_execute", count)
    try:
        async with db.sessions.begin() as session:
            await settle(session, [free])
    finally:
        event.remove(db.engine.sync_engine, "before_cursor_execute", count)
    assert not [s for s in statements if "budget" in s]
    # Unheld but priced: no reservation lookup, and the cost is still spent.
    async with db.sessions.begin() as session:
        await settle(session, [Settled(_rid(), principal.tenant_id, "UTC", 42, now, held=False)])
    assert await _period(db, principal) == (42, 0)
