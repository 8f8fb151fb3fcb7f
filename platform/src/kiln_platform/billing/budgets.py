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
from typing import TYPE_CHECKING, Any, NamedTuple
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
    WITH moved AS (
    INSERT INTO budget_periods AS b (tenant_id, period, spent_micros, reserved_micros)
    VALUES (:t, :p, :spent, 0)
    ON CONFLICT (tenant_id, period) DO UPDATE
        SET spent_micros = b.spent_micros + :spent, reserved_micros = b.reserved_micros - :held
    RETURNING tenant_id, spent_micros
    )
    SELECT m.spent_micros, q.monthly_budget_micros, q.budget_alert_percents
    FROM moved m LEFT JOIN quotas q ON q.tenant_id = m.tenant_id AND q.api_key_id IS NULL
    """
)
"""Moves one period's money; returns its new spent total with the tenant's budget and alert
thresholds (its tenant-wide quota row: at most one), so that settling reads them without a
statement of its own (a lone request's ledger flush is a handful of round trips; this was one)."""
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


class Period(NamedTuple):
    """A (tenant, period)'s spend after a move, and the tenant's budget (None: none) and alert
    thresholds in percent."""

    spent: int
    limit: int | None
    percents: Sequence[int]


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
) -> dict[Key, Period]:
    """Add ``spent`` and subtract ``held`` per (tenant, period); returns each period's new spent
    total with its tenant's budget and alert thresholds.

    Rows are updated in key order, so concurrent settlements cannot deadlock.
    """
    totals = {}
    for key in sorted(spent.keys() | held.keys()):
        tenant, period = key
        params = {"t": tenant, "p": period, "spent": spent.get(key, 0), "held": held.get(key, 0)}
        row = (await session.execute(_MOVE, params)).one()
        totals[key] = Period(int(row[0]), row[1], row[2] or ())
    return totals


def _held(taken: Iterable[Any]) -> dict[Key, int]:
    held: dict[Key, int] = defaultdict(int)
    for tenant, period, amount in taken:
        held[(tenant, period)] += amount
    return held


async def _thresholds(session: AsyncSession, totals: dict[Key, Period]) -> None:
    """Record each alert threshold a period's spend has reached (once per tenant and period)."""
    events = [
        {"t": tenant, "p": period, "pct": pct, "spent": total.spent, "limit": total.limit}
        for (tenant, period), total in totals.items()
        if total.limit is not None
        for pct in total.percents
        if total.spent * 100 >= total.limit * pct
    ]
    if events:
        await session.execute(_EVENT, events)
