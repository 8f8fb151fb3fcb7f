"""The rollups' pure parts: bucketing, ``Rollups.add``'s sums in key order, percentiles, series."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from types import SimpleNamespace

from sqlalchemy.ext.asyncio import async_sessionmaker

from kiln_platform.billing.rollup import EDGES_MS, ROLLUPS, Rollups, _rows, bucket_of, percentile
from kiln_platform.reports.overview import series, window

T = uuid.UUID(int=1)
AT = datetime(2026, 12, 1, 10, 42, 7, tzinfo=UTC)


def _event(status: int = 200, ms: float = 30.0, **kw: object) -> dict[str, object]:
    return {
        "tenant_id": T, "model": "m", "created_at": AT, "status": status, "queue_ms": 0.0,
        "compute_ms": ms, "input_tokens": 3, "output_tokens": 5, "cost_micros": 7, **kw,
    }  # fmt: skip


def test_buckets_are_upper_edges_inclusive() -> None:
    assert [bucket_of(x) for x in (0, 5, 5.1, 30000, 30001)] == [0, 0, 1, 11, len(EDGES_MS)]


def test_events_sum_per_hour_and_bucket() -> None:
    rollups = Rollups(async_sessionmaker())  # no flush: only the sums ``add`` keeps
    rollups.add([_event(), _event(status=500)])
    rollups.add([_event(ms=900.0)])
    hourly, fleet, daily = (_rows(out, keys) for out, (_, keys, _) in
                            zip(rollups._sums, ROLLUPS, strict=True))  # fmt: skip
    assert [(r["latency_bucket"], r["requests"], r["errors"]) for r in hourly] == [
        (3, 2, 1),
        (7, 1, 0),
    ]
    assert (hourly[0]["tenant_id"], hourly[0]["hour"]) == (T, AT.replace(minute=0, second=0))
    assert (hourly[0]["input_tokens"], hourly[0]["output_tokens"], hourly[0]["cost_micros"]) == (
        6,
        10,
        14,
    )
    assert [(r["latency_bucket"], r["requests"]) for r in fleet] == [(3, 2), (7, 1)]
    assert "tenant_id" not in fleet[0]
    assert daily == [{"tenant_id": T, "day": AT.date(), "requests": 3, "errors": 1,
                      "cost_micros": 21}]  # fmt: skip


def test_percentiles_from_bucket_counts() -> None:
    assert percentile({}, 0.5) is None
    counts = {1: 98, 7: 1, 12: 1}  # 98 at <= 10 ms, one <= 1 s, one slower than 30 s
    assert percentile(counts, 0.5) == 10.0
    assert percentile(counts, 0.99) == 1000.0
    assert percentile(counts, 1.0) == EDGES_MS[-1]


def test_today_is_24_hourly_points_with_zeros() -> None:
    name, start, step, points = window(None, AT)
    assert (name, start.hour, step, points) == ("today", 0, "hour", 24)
    row = SimpleNamespace(at=start.replace(hour=10), requests=2, errors=1, input_tokens=1,
                          output_tokens=2, cost_micros=9)  # fmt: skip
    made = series([row, row], start, step, points)
    assert (len(made), made[10].requests, made[10].tokens) == (24, 4, 6)
    assert sum(p.requests for p in made) == 4
    assert window("30d", AT)[1:] == (datetime(2026, 11, 2, tzinfo=UTC), "day", 30)
