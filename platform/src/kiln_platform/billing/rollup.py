"""Hourly usage rollup: what the ledger adds to ``usage_hourly`` in the transaction that
inserts the usage rows, and the pure arithmetic that reads it back (latency percentiles from
bucket counts)."""

from __future__ import annotations

import bisect
from collections import defaultdict
from datetime import UTC
from typing import TYPE_CHECKING, Any

from sqlalchemy.dialects.postgresql import insert

from kiln_platform.billing.tables import UsageHourly

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from sqlalchemy.ext.asyncio import AsyncSession

EDGES_MS = (5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0, 30000.0)
"""Upper edges of the latency buckets (ms); bucket ``len(EDGES_MS)`` is everything slower.
Migration 0015 repeats them for its backfill."""
TABLE = UsageHourly.metadata.tables["usage_hourly"]
FLEET = UsageHourly.metadata.tables["usage_fleet_hourly"]
DAILY = UsageHourly.metadata.tables["usage_tenant_daily"]
_SUMS = ("requests", "errors", "input_tokens", "output_tokens", "cost_micros")


def bucket_of(latency_ms: float) -> int:
    """The latency bucket of a request: the first whose edge is >= ``latency_ms``."""
    return bisect.bisect_left(EDGES_MS, latency_ms)


def _summed(
    events: Iterable[Mapping[str, Any]], keys: tuple[str, ...], sums: tuple[str, ...] = _SUMS
) -> list[dict[str, Any]]:
    """Usage rows summed per ``keys`` (of ``key_of``), in key order (so concurrent writers lock
    rows in the same order and cannot deadlock)."""
    out: dict[tuple[Any, ...], dict[str, int]] = defaultdict(lambda: dict.fromkeys(sums, 0))
    for e in events:
        made = key_of(e)
        row = out[tuple(made[k] for k in keys)]
        for name in sums:
            row[name] += int(e["status"] >= 400) if name == "errors" else int(e.get(name, 1))
    return [
        {**dict(zip(keys, key, strict=True)), **row}
        for key, row in sorted(out.items(), key=lambda kv: tuple(map(str, kv[0])))
    ]


def key_of(e: Mapping[str, Any]) -> dict[str, Any]:
    """The rollup keys of one usage row: tenant, hour, day, model, latency bucket."""
    hour = e["created_at"].astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    latency = float(e["queue_ms"]) + float(e["compute_ms"])
    return {"tenant_id": e["tenant_id"], "hour": hour, "day": hour.date(), "model": e["model"],
            "latency_bucket": bucket_of(latency)}  # fmt: skip


def hourly(events: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``usage_events`` rows summed per tenant, hour, model and latency bucket."""
    return _summed(events, ("tenant_id", "hour", "model", "latency_bucket"))


ROLLUPS = (
    (TABLE, ("tenant_id", "hour", "model", "latency_bucket"), _SUMS),
    (FLEET, ("hour", "model", "latency_bucket"), _SUMS),
    (DAILY, ("tenant_id", "day"), ("requests", "errors", "cost_micros")),
)
"""Each rollup table, its key and its sums: a tenant's hours (its overview), every tenant's
hours per model (the fleet view: no tenant), and each tenant's days (the busiest tenants)."""


async def add(session: AsyncSession, events: Iterable[Mapping[str, Any]]) -> None:
    """Add the inserted usage rows to the rollups, in the caller's transaction."""
    events = list(events)
    if not events:
        return
    for table, keys, sums in ROLLUPS:
        stmt = insert(table)
        stmt = stmt.on_conflict_do_update(
            index_elements=list(keys),
            set_={name: table.c[name] + stmt.excluded[name] for name in sums},
        )
        await session.execute(stmt, _summed(events, keys, sums))


def percentile(counts: Mapping[int, int], q: float) -> float | None:
    """The ``q`` quantile (0..1) of latency from bucket counts: the upper edge of the bucket
    holding it (ms), so an over- not an under-estimate; None without requests."""
    total = sum(counts.values())
    if total == 0:
        return None
    rank, seen = q * total, 0
    for bucket in sorted(counts):
        seen += counts[bucket]
        if seen >= rank:
            return EDGES_MS[min(bucket, len(EDGES_MS) - 1)]
    return EDGES_MS[-1]
