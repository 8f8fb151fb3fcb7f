"""Hourly usage rollup: what the ledger adds to ``usage_hourly`` in the transaction that
inserts the usage rows, and the pure arithmetic that reads it back (latency percentiles from
bucket counts)."""

from __future__ import annotations

import bisect
from collections import defaultdict
from typing import TYPE_CHECKING, Any

from sqlalchemy.dialects.postgresql import insert

from kiln_platform.billing.tables import UsageHourly

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from sqlalchemy.ext.asyncio import AsyncSession

EDGES_MS = (5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0, 30000.0)
"""Upper edges of the latency buckets (ms); bucket ``len(EDGES_MS)`` is everything slower.
Migration 0013 repeats them for its backfill."""
TABLE = UsageHourly.metadata.tables["usage_hourly"]
_SUMS = ("requests", "errors", "input_tokens", "output_tokens", "cost_micros")


def bucket_of(latency_ms: float) -> int:
    """The latency bucket of a request: the first whose edge is >= ``latency_ms``."""
    return bisect.bisect_left(EDGES_MS, latency_ms)


def hourly(events: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``usage_events`` rows summed per (tenant, hour, model, latency bucket), in key order (so
    concurrent writers lock rows in the same order and cannot deadlock)."""
    sums: dict[tuple[Any, ...], dict[str, int]] = defaultdict(lambda: dict.fromkeys(_SUMS, 0))
    for e in events:
        hour = e["created_at"].replace(minute=0, second=0, microsecond=0)
        latency = float(e["queue_ms"]) + float(e["compute_ms"])
        row = sums[(e["tenant_id"], hour, e["model"], bucket_of(latency))]
        row["requests"] += 1
        row["errors"] += int(e["status"] >= 400)
        row["input_tokens"] += int(e["input_tokens"])
        row["output_tokens"] += int(e["output_tokens"])
        row["cost_micros"] += int(e["cost_micros"])
    keys = ("tenant_id", "hour", "model", "latency_bucket")
    return [
        {**dict(zip(keys, key, strict=True)), **row}
        for key, row in sorted(sums.items(), key=lambda kv: (str(kv[0][0]), *kv[0][1:]))
    ]


async def add(session: AsyncSession, events: Iterable[Mapping[str, Any]]) -> None:
    """Add the inserted usage rows to the rollup, in the caller's transaction."""
    rows = hourly(events)
    if not rows:
        return
    stmt = insert(TABLE)
    stmt = stmt.on_conflict_do_update(
        constraint="pk_usage_hourly",
        set_={name: TABLE.c[name] + stmt.excluded[name] for name in _SUMS},
    )
    await session.execute(stmt, rows)


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
