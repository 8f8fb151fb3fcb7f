"""The batch runners' Prometheus series (the default registry, served at ``/metrics``): open
batches by status (the queue), batches ended by status, lines by outcome, a line's latency."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import Counter, Gauge, Histogram
from sqlalchemy import func, select

from kiln_platform.batches.schemas import OPEN
from kiln_platform.batches.tables import BatchJob

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

ENDED = ("completed", "failed", "expired", "cancelled")
OUTCOMES = ("ok", "error", "expired", "revoked")
"""A recorded line: answered, an error answer, not run before the window ended or after the
batch's key was revoked."""

OPEN_BATCHES = Gauge(
    "kiln_batches_open", "Open batches by status, in the database (every gateway reports them).",
    ["status"],
)  # fmt: skip
BATCHES_ENDED = Counter("kiln_batches_ended", "Batches this gateway ended, by status.", ["status"])
LINES = Counter("kiln_batch_lines", "Batch lines this gateway recorded, by outcome.", ["outcome"])
LINE_SECONDS = Histogram(
    "kiln_batch_line_duration_seconds", "A batch line's start to its record (retries included).",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900),
)  # fmt: skip
for _status in OPEN:
    OPEN_BATCHES.labels(_status)
for _status in ENDED:
    BATCHES_ENDED.labels(_status)
for _outcome in OUTCOMES:
    LINES.labels(_outcome)


async def count_open(sessions: async_sessionmaker[AsyncSession]) -> None:
    """Set ``kiln_batches_open`` from the ``batches`` table."""
    async with sessions() as session:
        rows = await session.execute(
            select(BatchJob.status, func.count())
            .where(BatchJob.status.in_(OPEN))
            .group_by(BatchJob.status)
        )
        counts: dict[str, int] = {status: n for status, n in rows.all()}
    for status in OPEN:
        OPEN_BATCHES.labels(status).set(counts.get(status, 0))
