"""The cost report from the daily charge rollup equals the charge lines summed directly: ranges
in instants that cut local days, ranges of local dates, a half-hour zone and one with summer
time, lines inserted over several statements, and a tenant whose time zone changes."""

from __future__ import annotations

import uuid
from collections import defaultdict
from dataclasses import replace
from datetime import UTC, datetime, time, timedelta
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

from sqlalchemy import select, text

from kiln_platform.billing.tables import UsageCharge
from kiln_platform.db.tables import Tenant
from kiln_platform.reports._query import CostQuery, cost_select

from .conftest import Admin

START = datetime(2025, 3, 1, tzinfo=UTC)
ZONES = ("Asia/Kolkata", "America/New_York")  # +05:30; summer time from 9 March


def _lines(tenant: uuid.UUID, key: uuid.UUID, n: int) -> list[UsageCharge]:
    """Lines every 7 h 13 min from 28 February, over two models, a key or none, two units."""
    return [
        UsageCharge(request_id=f"r{n}-{i}-{tenant.hex[:8]}", tenant_id=tenant,
                    model=f"m{i % 2}", version="v1", unit=("input_token", "request")[i % 3 == 0],
                    quantity=Decimal(i + 1) / 4, unit_price_micros=Decimal(1),
                    list_cost_micros=i * 11 + n, cost_micros=i * 10 + n, currency="USD",
                    api_key_id=key if i % 2 else None,
                    charged_at=START - timedelta(days=1) + i * timedelta(hours=7, minutes=13))
        for i in range(140)
    ]  # fmt: skip


async def _seed(admin: Admin, root: str, name: str) -> list[uuid.UUID]:
    tenants = [uuid.UUID(await admin.tenant(root, f"{name}-{z}")) for z in ZONES]
    async with admin.kiln.db.sessions.begin() as session:
        for tenant, zone in zip(tenants, ZONES, strict=True):
            await session.execute(text("UPDATE tenants SET timezone = :z WHERE id = :t"),
                                  {"z": zone, "t": tenant})  # fmt: skip
    for n in range(2):  # two inserts: the second adds to the rollup's rows
        async with admin.kiln.db.sessions.begin() as session:
            for tenant in tenants:
                session.add_all(_lines(tenant, uuid.uuid4(), n))
    return tenants


def _key(g: frozenset[str], tenant: Any, start: Any, day: Any, line: Any) -> tuple[Any, ...]:
    return (tenant if "tenant" in g else None, start, day if "day" in g else None,
            line.model if "model" in g else None, line.api_key_id if "key" in g else None,
            line.kind, line.unit, line.currency)  # fmt: skip


async def _direct(admin: Admin, q: CostQuery, tenants: list[uuid.UUID]) -> dict[Any, Any]:
    """The report's sums from the lines, in Python (zoneinfo)."""
    out: dict[Any, list[Any]] = defaultdict(lambda: [Decimal(0), 0, 0])
    async with admin.kiln.db.sessions() as session:
        zones = dict((await session.execute(select(Tenant.id, Tenant.timezone))).tuples().all())
        lines = await session.scalars(select(UsageCharge).where(UsageCharge.tenant_id.in_(tenants)))
        for c in lines:
            zone = ZoneInfo(zones[c.tenant_id])
            local = c.charged_at.astimezone(zone)
            lo, hi = q.start, q.end
            if q.local:
                lo, hi = (datetime.combine(d.date(), time(), zone) for d in (q.start, q.end))
            if not lo <= c.charged_at < hi:
                continue
            month = datetime.combine(local.date().replace(day=1), time(), zone)
            day = datetime.combine(local.date(), time(), zone)
            sums = out[_key(q.groups, c.tenant_id, month, day, c)]
            sums[0] += c.quantity
            sums[1] += c.cost_micros
            sums[2] += 1
    return {k: tuple(v) for k, v in out.items()}


async def _report(admin: Admin, q: CostQuery, tenants: list[uuid.UUID]) -> dict[Any, Any]:
    async with admin.kiln.db.sessions() as session:
        rows = (await session.execute(cost_select(q))).all()
    return {
        _key(q.groups, r.tenant_id, r.period_start, r.day_start, r): (
            r.quantity, int(r.cost_micros), int(r.lines))
        for r in rows
        if r.tenant_id in tenants or (q.tenant_id and "tenant" not in q.groups)
    }  # fmt: skip


RANGES = [
    (START, START + timedelta(days=30), False),  # a UTC month: cuts both tenants' days
    (START + timedelta(hours=5, minutes=31), datetime(2025, 3, 10, 6, 30, tzinfo=UTC), False),
    (START, START + timedelta(days=31), True),  # March in each tenant's zone
    (datetime(2025, 3, 9, tzinfo=UTC), datetime(2025, 3, 12, tzinfo=UTC), True),
]


async def test_the_rollup_reports_what_the_lines_add_up_to(admin: Admin, root: str) -> None:
    tenants = await _seed(admin, root, "rollup")
    for groups in ("tenant,day", "tenant,model,key", "tenant,model,day"):
        for start, end, local in RANGES:
            q = CostQuery(start, end, frozenset(groups.split(",")), local=local)
            direct = await _direct(admin, q, tenants)
            assert len(direct) > 10
            assert await _report(admin, q, tenants) == direct, (groups, start, end, local)
    q = CostQuery(START, START + timedelta(days=20), frozenset({"day"}), tenants[0])
    assert await _report(admin, q, tenants) == await _direct(admin, q, tenants[:1])
    async with admin.kiln.db.sessions.begin() as session:  # a new zone: the days are rebuilt
        await session.execute(text("UPDATE tenants SET timezone = 'Asia/Tokyo' WHERE id = :t"),
                              {"t": tenants[0]})  # fmt: skip
    q = CostQuery(START, START + timedelta(days=31), frozenset({"tenant", "day"}), local=True)
    assert await _report(admin, q, tenants) == await _direct(admin, q, tenants)
    first = min(k[2] for k in await _report(admin, q, tenants) if k[0] == tenants[0])
    assert first == datetime(2025, 3, 1, tzinfo=ZoneInfo("Asia/Tokyo"))


async def test_a_page_and_its_subtotals_come_from_one_read(admin: Admin, root: str) -> None:
    """The costs page's read: the first rows with the report's row count, then the report
    grouped by the subtotal's dimension, each as the report alone gives them."""
    tenants = await _seed(admin, root, "page")
    # one tenant, or both: two zones whose days start at different instants, the first rows
    # cut within a day's groups (7) or after several days' (60)
    for local, tenant, limit in ((True, tenants[1], 7), (False, tenants[1], 7), (True, None, 7),
                                 (True, None, 60), (False, None, 60)):  # fmt: skip
        q = CostQuery(START, START + timedelta(days=12), frozenset({"tenant", "model", "day"}),
                      tenant, local)  # fmt: skip
        async with admin.kiln.db.sessions() as session:
            whole = (await session.execute(cost_select(q))).all()
            coarse = (await session.execute(cost_select(replace(q, groups=frozenset())))).all()
            page = await session.execute(cost_select(replace(q, limit=limit, also=frozenset())))
            rows = page.all()
        assert [r[:-2] for r in rows if r.part == 0] == [tuple(r) for r in whole[:limit]]
        assert {r.groups for r in rows if r.part == 0} == {len(whole)}
        assert sorted(r[:-2] for r in rows if r.part == 1) == sorted(tuple(r) for r in coarse)
