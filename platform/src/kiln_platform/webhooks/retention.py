"""Deliveries that ended (delivered, or failed for good) are deleted, with their attempts,
once ``KILN_WEBHOOK_RETENTION_S`` has passed since they ended; the sender's loop calls
``prune`` every ``PRUNE_EVERY_S``, in short batches so it never holds many row locks."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import text

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

PRUNE_EVERY_S = 300.0
"""How often each gateway's sender looks for deliveries past their retention."""
BATCH = 1000
"""Deliveries deleted per transaction."""
MAX_BATCHES = 100
"""Transactions per prune: what is left waits for the next one."""
_PRUNE = text(
    """
    DELETE FROM webhook_deliveries WHERE id IN (
        SELECT id FROM webhook_deliveries
        WHERE state IN ('delivered', 'failed')
          AND coalesce(delivered_at, window_from) < now() - make_interval(secs => :keep)
        LIMIT :n FOR UPDATE SKIP LOCKED)
    """
)


async def prune(
    sessions: async_sessionmaker[AsyncSession], retention_s: float, batch: int = BATCH
) -> int:
    """Delete the deliveries that ended more than ``retention_s`` ago (a delivered one at its
    delivery, a failed one at the start of its last retry window); how many."""
    deleted = 0
    for _ in range(MAX_BATCHES):
        async with sessions.begin() as session:
            result = await session.execute(_PRUNE, {"keep": retention_s, "n": batch})
        n = result.rowcount  # type: ignore[attr-defined]
        deleted += n
        if n < batch:
            break
    return deleted
