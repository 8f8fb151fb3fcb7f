"""The ledger keeps the hourly rollup in the transaction of the usage rows, and the overview
reads it: a tenant sees its own numbers and limits, the fleet view sees every tenant."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
from sqlalchemy import text

from kiln_platform.admin.authz import Actor, Role
from kiln_platform.billing.ledger import write
from kiln_platform.db.database import Database
from kiln_platform.errors import Forbidden, NotFound
from kiln_platform.reports.overview import fleet_overview, tenant_overview
from kiln_platform.tenants.services import insert_tenant

from .test_ledger import _usage

ADMIN = Actor("cli:test", Role.PLATFORM_ADMIN, None)


async def _tenant(db: Database) -> uuid.UUID:
    async with db.sessions.begin() as session:
        return (await insert_tenant(session, f"r-{uuid.uuid4().hex[:8]}")).id


async def test_usage_rows_roll_up_and_the_overview_reads_them(db: Database) -> None:
    tenant, other = await _tenant(db), await _tenant(db)
    now = datetime.now(UTC)
    usages = [_usage(tenant, compute_ms=20.0, at=now), _usage(tenant, 500, at=now),
              _usage(other, at=now)]  # fmt: skip
    async with db.sessions.begin() as session:
        await write(session, usages, [])
        await write(session, usages[:1], [])  # a retried batch: counted once
    async with db.sessions.begin() as session:
        await session.execute(
            text("INSERT INTO quotas (id, tenant_id, rpm) VALUES (:i, :t, 60)"),
            {"i": uuid.uuid4(), "t": tenant},
        )
    member = Actor("user:m", Role.TENANT_MEMBER, tenant)
    async with db.sessions.begin() as session:
        await session.execute(text("SET LOCAL kiln.scope = ''"))
        await session.execute(text(f"SET LOCAL kiln.tenant_id = '{tenant}'"))
        mine = await tenant_overview(session, member, tenant, "today", now, platform=db.sessions)
        with pytest.raises(NotFound):
            await tenant_overview(session, member, other, "today", now, platform=db.sessions)
        with pytest.raises(Forbidden):
            await fleet_overview(session, member, "today", now)
    t = mine.totals
    assert (t.requests, t.errors, t.input_tokens, t.output_tokens) == (2, 1, 6, 10)
    assert (t.p50_ms, t.p99_ms) == (5.0, 25.0)  # 1.5 ms and 20 ms: bucket upper edges
    assert sum(p.requests for p in mine.series) == 2
    assert [(g.name, g.limit) for g in mine.gauges] == [("Requests this minute", 60)]
    async with db.sessions.begin() as session:
        fleet = await fleet_overview(session, ADMIN, "7d", now)
    assert fleet.models["m"].requests >= 3
    assert {tenant, other} <= {u.tenant_id for u in fleet.top_tenants} or len(
        fleet.top_tenants
    ) == 10
