"""Usage rollups: the usage rows the ledger inserted, summed in memory per tenant, hour, model
and latency bucket (and per model, and per tenant and day) and added to ``usage_hourly``,
``usage_fleet_hourly`` and ``usage_tenant_daily`` every ``FLUSH_S`` seconds, one upsert per
table; and the pure arithmetic that reads them back (latency percentiles from bucket counts).

Not in the ledger's transaction: every batch upserting the same few rows (one per model and
hour in the fleet table) cost a fifth of embeddings throughput on two cores
(``bench/tracing.py --baseline``, docs/benchmarks.md). The rows are derived data: a gateway
that dies loses at most its last ``FLUSH_S`` seconds of overview counts; the usage rows and
the bill are unaffected, and migration 0015's backfill rebuilds the rollups from them."""

from __future__ import annotations

import asyncio
import bisect
import contextlib
from datetime import UTC
from typing import TYPE_CHECKING, Any

import structlog
from sqlalchemy.dialects.postgresql import insert

from kiln_platform.billing.tables import UsageHourly

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

log = structlog.get_logger("kiln.rollup")
FLUSH_S = 2.0
"""How often the sums are added to the tables (the console overview polls every 5 s)."""

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


Sums = dict[tuple[Any, ...], dict[str, int]]


def _sum_into(
    out: Sums, events: Iterable[Mapping[str, Any]], keys: tuple[str, ...], sums: tuple[str, ...]
) -> None:
    """Add usage rows to ``out`` per ``keys`` (of ``key_of``): each row is one request, an error
    if its status is 400 or more."""
    for e in events:
        made = key_of(e)
        row = out.setdefault(tuple(made[k] for k in keys), dict.fromkeys(sums, 0))
        for name in sums:
            if name == "requests":
                row[name] += 1
            elif name == "errors":
                row[name] += int(e["status"] >= 400)
            else:
                row[name] += int(e[name])


def _rows(out: Sums, keys: tuple[str, ...]) -> list[dict[str, Any]]:
    """The sums as table rows, in key order (concurrent writers lock rows in the same order and
    cannot deadlock)."""
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


ROLLUPS = (
    (TABLE, ("tenant_id", "hour", "model", "latency_bucket"), _SUMS),
    (FLEET, ("hour", "model", "latency_bucket"), _SUMS),
    (DAILY, ("tenant_id", "day"), ("requests", "errors", "cost_micros")),
)
"""Each rollup table, its key and its sums: a tenant's hours (its overview), every tenant's
hours per model (the fleet view: no tenant), and each tenant's days (the busiest tenants)."""


class Rollups:
    """This process's usage sums not yet in the rollup tables (``add``), and the task that adds
    them every ``FLUSH_S`` seconds (``start``/``stop``; ``flush`` once)."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession], every_s: float = FLUSH_S):
        self._sessions = sessions
        self._every_s = every_s
        self._sums: list[Sums] = [{} for _ in ROLLUPS]
        self._task: asyncio.Task[None] | None = None

    def add(self, events: Iterable[Mapping[str, Any]]) -> None:
        """Count usage rows the ledger committed (no I/O)."""
        events = list(events)
        for out, (_, keys, sums) in zip(self._sums, ROLLUPS, strict=True):
            _sum_into(out, events, keys, sums)

    async def flush(self) -> None:
        """Add the sums to the tables, one upsert per table in one transaction; on failure
        they are kept for the next flush."""
        taken, self._sums = self._sums, [{} for _ in ROLLUPS]
        if not any(taken):
            return
        try:
            async with self._sessions.begin() as session:
                for out, (table, keys, sums) in zip(taken, ROLLUPS, strict=True):
                    if out:
                        await _upsert(session, table, keys, sums, _rows(out, keys))
        except BaseException:
            for kept, out, (_, _, sums) in zip(self._sums, taken, ROLLUPS, strict=True):
                for key, row in out.items():
                    into = kept.setdefault(key, dict.fromkeys(sums, 0))
                    for name in sums:
                        into[name] += row[name]
            raise

    async def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="usage-rollups")

    async def stop(self) -> None:
        """Stop the task and add what is left."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.flush()

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._every_s)
            try:
                await self.flush()
            except Exception:
                log.exception("usage rollup flush failed; kept for the next one")


async def _upsert(
    session: AsyncSession, table: Any, keys: tuple[str, ...], sums: tuple[str, ...],
    rows: list[dict[str, Any]],
) -> None:  # fmt: skip
    stmt = insert(table)
    stmt = stmt.on_conflict_do_update(
        index_elements=list(keys), set_={name: table.c[name] + stmt.excluded[name] for name in sums}
    )
    await session.execute(stmt, rows)


def percentile(counts: Mapping[int, int], q: float) -> float | None:
    """The ``q`` quantile (0..1) of latency from bucket counts: the upper edge of the bucket
    holding it (ms), an over-estimate; for the open bucket past the last edge, that edge (there
    a lower bound); None without requests."""
    total = sum(counts.values())
    if total == 0:
        return None
    rank, seen = q * total, 0
    for bucket in sorted(counts):
        seen += counts[bucket]
        if seen >= rank:
            return EDGES_MS[min(bucket, len(EDGES_MS) - 1)]
    return EDGES_MS[-1]
