"""The console overview's numbers, read from the rollups (``billing.rollup``), never from
``usage_events``: a tenant's usage, latency, spend and limits, and the platform's fleet view.

A range is today (hourly points, UTC), or the last 7 or 30 days (daily points, today included).
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

from sqlalchemy import text

from kiln_platform.admin.authz import Actor, Role, check_tenant, require
from kiln_platform.billing.rollup import percentile
from kiln_platform.errors import BadRequest, Forbidden
from kiln_platform.quotas.services import get_quotas

if TYPE_CHECKING:
    from collections.abc import Sequence

    from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

    Sessions = async_sessionmaker[AsyncSession]

Range = Literal["today", "7d", "30d"]
RANGES: dict[str, int] = {"today": 1, "7d": 7, "30d": 30}
"""Each range and its days."""
TOP = 10


@dataclass(frozen=True, slots=True)
class Point:
    """One hour's or day's usage."""

    at: datetime
    requests: int = 0
    errors: int = 0
    tokens: int = 0
    cost_micros: int = 0


@dataclass(slots=True)
class Totals:
    """Usage summed over a range; latency percentiles are bucket upper edges (ms)."""

    requests: int = 0
    errors: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_micros: int = 0
    latency: dict[int, int] = field(default_factory=dict)

    @property
    def p50_ms(self) -> float | None:
        """Median latency (ms), None without requests."""
        return percentile(self.latency, 0.5)

    @property
    def p99_ms(self) -> float | None:
        """99th percentile latency (ms), None without requests."""
        return percentile(self.latency, 0.99)

    def add(self, row: Any) -> None:
        """Add one rollup row (``latency_bucket``, the sums)."""
        self.requests += row.requests
        self.errors += row.errors
        self.input_tokens += row.input_tokens
        self.output_tokens += row.output_tokens
        self.cost_micros += row.cost_micros
        self.latency[row.latency_bucket] = self.latency.get(row.latency_bucket, 0) + row.requests


@dataclass(frozen=True, slots=True)
class Gauge:
    """One limit and how much of it is used now."""

    name: str
    used: int
    limit: int
    unit: str


@dataclass(frozen=True, slots=True)
class TenantOverview:
    """A tenant's usage over a range, as points and totals, and its limits as gauges."""

    tenant_id: uuid.UUID
    range: str
    step: str
    totals: Totals
    series: list[Point]
    gauges: list[Gauge]


@dataclass(frozen=True, slots=True)
class TenantUse:
    """One of the busiest tenants."""

    tenant_id: uuid.UUID
    name: str
    requests: int
    errors: int
    cost_micros: int


@dataclass(frozen=True, slots=True)
class FleetOverview:
    """Traffic over a range: per model (totals with latency), over time, and top tenants."""

    range: str
    step: str
    models: dict[str, Totals]
    series: list[Point]
    top_tenants: list[TenantUse]


def window(range_: str | None, now: datetime) -> tuple[str, datetime, str, int]:
    """The range's name, first instant, step (``hour`` or ``day``) and number of points."""
    name = range_ or "today"
    if name not in RANGES:
        raise BadRequest(f"'range' must be one of {', '.join(RANGES)}.", param="range")
    today = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    days = RANGES[name]
    if days == 1:
        return name, today, "hour", 24
    return name, today - timedelta(days=days - 1), "day", days


def series(rows: Sequence[Any], start: datetime, step: str, points: int) -> list[Point]:
    """Rollup rows (``at`` and sums) as one point per step from ``start``, zeros included."""
    delta = timedelta(hours=1) if step == "hour" else timedelta(days=1)
    sums: dict[datetime, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for r in rows:
        s = sums[r.at]
        s[0] += r.requests
        s[1] += r.errors
        s[2] += r.input_tokens + r.output_tokens
        s[3] += r.cost_micros
    instants = [start + delta * i for i in range(points)]
    return [Point(at, *sums.get(at, (0, 0, 0, 0))) for at in instants]


_TENANT = text(
    "SELECT date_trunc(:step, hour) AS at, latency_bucket, sum(requests)::bigint AS requests,"
    " sum(errors)::bigint AS errors, sum(input_tokens)::bigint AS input_tokens,"
    " sum(output_tokens)::bigint AS output_tokens, sum(cost_micros)::bigint AS cost_micros"
    " FROM usage_hourly WHERE tenant_id = :t AND hour >= :start GROUP BY 1, 2"
)
_FLEET = text(
    "SELECT date_trunc(:step, hour) AS at, model, latency_bucket,"
    " sum(requests)::bigint AS requests, sum(errors)::bigint AS errors,"
    " sum(input_tokens)::bigint AS input_tokens, sum(output_tokens)::bigint AS output_tokens,"
    " sum(cost_micros)::bigint AS cost_micros"
    " FROM usage_fleet_hourly WHERE hour >= :start GROUP BY 1, 2, 3"
)
_TOP = text(
    "SELECT u.tenant_id, t.name, u.requests, u.errors, u.cost_micros FROM"
    " (SELECT tenant_id, sum(requests)::bigint AS requests, sum(errors)::bigint AS errors,"
    "  sum(cost_micros)::bigint AS cost_micros FROM usage_tenant_daily WHERE day >= :day"
    "  GROUP BY tenant_id ORDER BY 2 DESC LIMIT :n) u"
    " JOIN tenants t ON t.id = u.tenant_id ORDER BY u.requests DESC"
)
_MINUTE = text(
    "SELECT coalesce(sum(requests), 0), coalesce(sum(tokens), 0) FROM quota_counters"
    " WHERE subject = :s AND window_start = date_trunc('minute', now())"
)
_LEASES = text("SELECT count(*) FROM quota_leases WHERE subject = :s AND expires_at > now()")


async def tenant_overview(
    session: AsyncSession, actor: Actor, tenant_id: uuid.UUID, range_: str | None,
    now: datetime, *, platform: Sessions,
) -> TenantOverview:  # fmt: skip
    """A tenant's usage over the range and its limits (another tenant's: ``NotFound``).

    The quota counters are not tenant tables (the tenant role may not read them): this
    tenant's are read through ``platform`` sessions, after the checks.
    """
    require(actor, "overview")
    check_tenant(actor, tenant_id, "tenant")
    name, start, step, points = window(range_, now)
    rows = (await session.execute(_TENANT, {"step": step, "t": tenant_id, "start": start})).all()
    totals = Totals()
    for row in rows:
        totals.add(row)
    gauges = await _gauges(session, actor, tenant_id, platform)
    return TenantOverview(tenant_id, name, step, totals, series(rows, start, step, points), gauges)


async def _gauges(
    session: AsyncSession, actor: Actor, tenant_id: uuid.UUID, platform: Sessions
) -> list[Gauge]:
    """Each limit the tenant has, with this minute's requests and tokens, the requests in flight
    and this month's spend (settled and held)."""
    quotas = await get_quotas(session, actor, tenant_id)
    subject = f"tenant:{tenant_id}"
    async with platform() as counters:
        minute = (await counters.execute(_MINUTE, {"s": subject})).one()
        leases = int(await counters.scalar(_LEASES, {"s": subject}) or 0)
    limits, gauges = quotas.limits, []
    if limits.rpm is not None:
        gauges.append(Gauge("Requests this minute", int(minute[0]), limits.rpm, "requests/min"))
    if limits.tpm is not None:
        gauges.append(Gauge("Tokens this minute", int(minute[1]), limits.tpm, "tokens/min"))
    if limits.concurrency is not None:
        gauges.append(Gauge("Requests in flight", leases, limits.concurrency, "requests"))
    budget = quotas.budget
    if budget.limit_micros is not None:
        used = budget.spent_micros + budget.reserved_micros
        gauges.append(Gauge("Monthly budget", used, budget.limit_micros, "micros"))
    return gauges


async def fleet_overview(session: AsyncSession, actor: Actor, range_: str | None,
                         now: datetime) -> FleetOverview:  # fmt: skip
    """Every tenant's traffic over the range, per model and over time, and the busiest tenants
    (platform-admins only)."""
    require(actor, "overview")
    if actor.role is not Role.PLATFORM_ADMIN:
        raise Forbidden("The fleet overview is the platform-admin's.")
    name, start, step, points = window(range_, now)
    rows = (await session.execute(_FLEET, {"step": step, "start": start})).all()
    models: dict[str, Totals] = defaultdict(Totals)
    for row in rows:
        models[row.model].add(row)
    top = (await session.execute(_TOP, {"day": start.date(), "n": TOP})).all()
    return FleetOverview(
        name, step, dict(sorted(models.items())), series(rows, start, step, points),
        [TenantUse(*r) for r in top],
    )  # fmt: skip
