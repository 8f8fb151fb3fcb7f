"""Concurrency leases and budget holds renewed while their request runs, on a real PostgreSQL:
one with a TTL far shorter than its request keeps the limit enforced and the hold present; once
released, renewal stops and nothing is left; a killed process's lapse and are swept."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime

import pytest
from sqlalchemy import text

from kiln_platform.admin.authz import Actor, Role
from kiln_platform.billing.pricebooks import PriceBooks, create_book
from kiln_platform.billing.pricing import Quantities
from kiln_platform.billing.reservations import Budgets
from kiln_platform.billing.schemas import PriceBookCreate, PriceIn
from kiln_platform.db.database import Database
from kiln_platform.errors import RateLimited
from kiln_platform.keys.services import Principal
from kiln_platform.quotas.enforcer import QuotaEnforcer, QuotaGrant
from kiln_platform.tenants.services import insert_tenant
from tests.factories import resolved_version

CLI = Actor("cli:test", Role.PLATFORM_ADMIN, None)
TTL = 0.3
PRICES = [
    PriceIn(model="lease-llm", unit="output_token", unit_price_micros="1"),
    PriceIn(model="lease-llm", unit="compute_second", unit_price_micros="10"),
]


VERSION = resolved_version("lease-llm")


@pytest.fixture(scope="module", autouse=True)
async def _prices(db: Database) -> None:
    async with db.sessions.begin() as session:
        start = datetime(2020, 1, 1, tzinfo=UTC)
        await create_book(session, CLI, PriceBookCreate(prices=PRICES, effective_from=start))


async def _tenant(db: Database, concurrency: int = 1, budget: int = 10**9) -> Principal:
    async with db.sessions.begin() as session:
        tenant = await insert_tenant(session, f"l-{uuid.uuid4().hex[:8]}")
        await session.execute(
            text(
                "INSERT INTO quotas (id, tenant_id, concurrency, monthly_budget_micros)"
                " VALUES (:i, :t, :c, :b)"
            ),
            {"i": uuid.uuid4(), "t": tenant.id, "c": concurrency, "b": budget},
        )
    return Principal(tenant.id, None, frozenset({"inference"}))


def _quotas(db: Database, ttl_s: float = TTL) -> QuotaEnforcer:
    """A gateway's enforcer whose leases outlive no request timeout (0): only renewal holds them."""
    return QuotaEnforcer(db.sessions, ttl=60.0, lease_ttl_s=ttl_s, timeout_s=0.0)


async def _rows(db: Database, table: str, principal: Principal) -> int:
    where = {
        "quota_leases": "subject = 'tenant:' || :t",
        "budget_reservations": "tenant_id = CAST(:t AS uuid)",
    }[table]
    async with db.sessions() as session:
        count = await session.scalar(
            text(f"SELECT count(*) FROM {table} WHERE {where}"),  # noqa: S608
            {"t": str(principal.tenant_id)},
        )
    return int(count or 0)


async def _admit(quotas: QuotaEnforcer, principal: Principal) -> QuotaGrant:
    admission = QuotaGrant()
    await quotas.admit(principal, admission)
    return admission


async def test_a_renewed_lease_outlives_its_ttl_and_is_released_once(db: Database) -> None:
    principal = await _tenant(db)
    gateway, other = _quotas(db), _quotas(db)
    await gateway.start()
    try:
        first = await _admit(gateway, principal)
        assert first.lease is not None
        await asyncio.sleep(6 * TTL)  # a stream far longer than the lease's TTL
        with pytest.raises(RateLimited, match="Concurrency limit"):  # another gateway
            await _admit(other, principal)
        assert await _rows(db, "quota_leases", principal) == 1
        await gateway.release(first.lease)
        assert await _rows(db, "quota_leases", principal) == 0
        assert await gateway.renew() == 0  # renewal stopped with the release
        second = await _admit(other, principal)
        assert second.lease is not None
    finally:
        await gateway.stop()


async def test_a_killed_gateways_lease_lapses_after_its_ttl(db: Database) -> None:
    principal = await _tenant(db)
    killed, other = _quotas(db), _quotas(db)
    await _admit(killed, principal)  # never renewed, never released
    with pytest.raises(RateLimited):
        await _admit(other, principal)
    await asyncio.sleep(2 * TTL)
    assert (await _admit(other, principal)).lease is not None


async def test_a_renewed_hold_outlives_its_ttl_and_the_sweep(db: Database) -> None:
    principal = await _tenant(db)
    quotas = _quotas(db)
    books = PriceBooks(db.sessions, 60.0)
    gateway = Budgets(db.sessions, quotas, books, timeout_s=0.0, ttl_s=TTL, sweep_s=TTL)
    sweeper = Budgets(db.sessions, quotas, books, timeout_s=0.0, ttl_s=TTL, sweep_s=TTL)
    killed = Budgets(db.sessions, quotas, books, timeout_s=0.0, ttl_s=TTL)
    most = Quantities(output_tokens=100)
    await gateway.start()
    await sweeper.start()
    try:
        await gateway.reserve(principal, "req_lease_running", VERSION, most, run_s=0.0)
        await killed.reserve(principal, "req_lease_killed", VERSION, most, run_s=0.0)
        await asyncio.sleep(6 * TTL)  # the sweeper has run several times
        async with db.sessions() as session:
            left = set(
                await session.scalars(
                    text("SELECT request_id FROM budget_reservations WHERE tenant_id = :t"),
                    {"t": principal.tenant_id},
                )
            )
        assert left == {"req_lease_running"}  # the killed process's hold was swept
        await gateway.finish("req_lease_running")
        assert await _rows(db, "budget_reservations", principal) == 0
        assert await gateway.renew() == 0
    finally:
        await gateway.stop()
        await sweeper.stop()


async def test_the_hold_covers_the_servers_bound_not_the_clients_timeout(db: Database) -> None:
    principal = await _tenant(db)
    quotas = _quotas(db)
    budgets = Budgets(
        db.sessions, quotas, PriceBooks(db.sessions, 60.0), timeout_s=60.0, ttl_s=30.0
    )
    most = Quantities(output_tokens=100)
    await budgets.reserve(principal, "req_bound_default", VERSION, most)
    await budgets.reserve(principal, "req_bound_stream", VERSION, most, run_s=300.0)
    async with db.sessions() as session:
        rows: dict[str, int] = dict(
            (
                await session.execute(
                    text(
                        "SELECT request_id, amount_micros FROM budget_reservations"
                        " WHERE tenant_id = :t"
                    ),
                    {"t": principal.tenant_id},
                )
            ).all()
        )
        lives = await session.scalar(
            text(
                "SELECT min(extract(epoch FROM expires_at - now())) FROM budget_reservations"
                " WHERE request_id = 'req_bound_stream'"
            )
        )
    # 100 output tokens + 10 per compute second: 60 s (the request timeout), 300 s (the stream's)
    assert rows == {"req_bound_default": 100 + 600, "req_bound_stream": 100 + 3000}
    assert 300.0 < float(lives) <= 330.0
    for rid in rows:
        await budgets.finish(rid)
