"""Monthly budgets: the period a moment belongs to, and settling reservations to actual cost.

A tenant's budget is counted per calendar month of its time zone in ``budget_periods``:
``spent_micros`` (settled cost) and ``reserved_micros`` (worst cases held by requests in
flight). Admission reserves (``billing.reservations``); the ledger settles inside the
transaction that inserts the usage events, so a request's cost moves from reserved to spent
exactly once, together with its ledger row.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from dataclasses import dataclass
from datetime import date, datetime, time
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

from sqlalchemy import text

from kiln_platform.billing.pricing import charges, cost
from kiln_platform.webhooks.events import fan_out

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from sqlalchemy.ext.asyncio import AsyncSession

    from kiln_platform.billing.pricing import PriceList, Quantities

_TAKE = text(
    "DELETE FROM budget_reservations WHERE request_id = ANY(:ids)"
    " RETURNING tenant_id, period, amount_micros"
)
_MOVE = text(
    """
    INSERT INTO budget_periods AS b (tenant_id, period, spent_micros, reserved_micros)
    VALUES (:t, :p, :spent, 0)
    ON CONFLICT (tenant_id, period) DO UPDATE
        SET spent_micros = b.spent_micros + :spent, reserved_micros = b.reserved_micros - :held
    RETURNING spent_micros
    """
)
_LIMITS = text(
    "SELECT tenant_id, monthly_budget_micros, budget_alert_percents FROM quotas"
    " WHERE tenant_id = ANY(:ts) AND api_key_id IS NULL AND monthly_budget_micros IS NOT NULL"
)
_CROSSED = """
    WITH event AS (
    INSERT INTO budget_events (tenant_id, period, threshold_percent, spent_micros, limit_micros)
    VALUES (:t, :p, :pct, :spent, :limit)
    ON CONFLICT (tenant_id, period, threshold_percent) DO NOTHING
    RETURNING tenant_id, jsonb_build_object(
        'tenant_id', tenant_id, 'period', to_char(period, 'YYYY-MM'),
        'threshold_percent', threshold_percent, 'spent_micros', spent_micros,
        'limit_micros', limit_micros) AS data
    )
"""
# The event, and in the same statement a delivery to each of the tenant's webhooks for it.
_EVENT = text(_CROSSED + fan_out("budget.threshold_reached"))

Key = tuple[uuid.UUID, date]


def period_of(timezone: str, when: datetime) -> date:
    """The first day of the calendar month ``when`` falls in, in the IANA zone ``timezone``."""
    return when.astimezone(ZoneInfo(timezone)).date().replace(day=1)


def period_end(timezone: str, period: date) -> datetime:
    """The instant the next period starts (midnight of the 1st, in the zone)."""
    first = date(period.year + period.month // 12, period.month % 12 + 1, 1)
    return datetime.combine(first, time(), ZoneInfo(timezone))


def worst_case(
    book: PriceList | None, model: str, version: str, plan: str, most: Quantities
) -> int:
    """The most a request can cost, in micro-units: its price at its maximum quantities.

    Rounding and discounts are monotonic, so a request that consumes no more of any unit than
    ``most`` never costs more than this.
    """
    return cost(charges(book, model, version, plan, most))[1]


@dataclass(frozen=True, slots=True)
class Settled:
    """One request's actual cost, recorded by the ledger."""

    request_id: str
    tenant_id: uuid.UUID
    timezone: str
    cost_micros: int
    charged_at: datetime
    held: bool = True
    """Whether this process held a reservation for it (False: nothing to take back)."""


async def settle(session: AsyncSession, rows: Sequence[Settled]) -> None:
    """Move each request's cost from reserved to spent, then record soft thresholds crossed.

    Call it inside the transaction that inserts the requests' ledger rows (once per request).
    A reservation already expired (or never made) releases nothing; the cost is spent anyway.
    """
    spent: dict[Key, int] = defaultdict(int)
    for row in rows:
        if row.cost_micros:
            spent[(row.tenant_id, period_of(row.timezone, row.charged_at))] += row.cost_micros
    holds = [r.request_id for r in rows if r.held]
    held = await take(session, holds) if holds else {}
    if spent or held:  # requests that cost nothing and held nothing change no period
        await _thresholds(session, await move(session, spent, held))


async def take(session: AsyncSession, request_ids: list[str]) -> dict[Key, int]:
    """Delete these requests' reservations; what they held per (tenant, period)."""
    return _held(await session.execute(_TAKE, {"ids": request_ids}))


async def move(
    session: AsyncSession, spent: dict[Key, int], held: dict[Key, int]
) -> dict[Key, int]:
    """Add ``spent`` and subtract ``held`` per (tenant, period); returns the new spent totals.

    Rows are updated in key order, so concurrent settlements cannot deadlock.
    """
    totals = {}
    for key in sorted(spent.keys() | held.keys()):
        tenant, period = key
        params = {"t": tenant, "p": period, "spent": spent.get(key, 0), "held": held.get(key, 0)}
        totals[key] = int(await session.scalar(_MOVE, params) or 0)
    return totals


def _held(taken: Iterable[Any]) -> dict[Key, int]:
    held: dict[Key, int] = defaultdict(int)
    for tenant, period, amount in taken:
        held[(tenant, period)] += amount
    return held


async def _thresholds(session: AsyncSession, totals: dict[Key, int]) -> None:
    """Record each alert threshold a period's spend has reached (once per tenant and period)."""
    tenants = sorted({t for t, _ in totals})
    limits = {r[0]: (r[1], r[2]) for r in await session.execute(_LIMITS, {"ts": tenants})}
    events = [
        {"t": tenant, "p": period, "pct": pct, "spent": spent, "limit": limits[tenant][0]}
        for (tenant, period), spent in totals.items()
        if tenant in limits
        for pct in limits[tenant][1]
        if spent * 100 >= limits[tenant][0] * pct
    ]
    if events:
        await session.execute(_EVENT, events)
