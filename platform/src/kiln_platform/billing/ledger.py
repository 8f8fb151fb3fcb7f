"""The usage ledger writer: one row per request, written in batches off the request path."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import structlog
from sqlalchemy.dialects.postgresql import insert

from kiln_platform.db.tables import UsageEvent

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

log = structlog.get_logger("kiln.ledger")


@dataclass(frozen=True, slots=True)
class Usage:
    """What one request consumed."""

    request_id: str
    tenant_id: uuid.UUID
    api_key_id: uuid.UUID | None
    model: str
    version: str
    endpoint: str
    status: int
    input_tokens: int = 0
    output_tokens: int = 0
    items: int = 0
    queue_ms: float = 0.0
    compute_ms: float = 0.0


class LedgerWriter:
    """Buffers usage events; inserts them every ``interval`` s (idempotent by request id)."""

    def __init__(
        self, sessions: async_sessionmaker[AsyncSession], interval: float = 0.2, batch: int = 1000
    ) -> None:
        self._sessions = sessions
        self._interval = interval
        self._batch = batch
        self._pending: list[Usage] = []
        self._task: asyncio.Task[None] | None = None

    def record(self, usage: Usage) -> None:
        """Queue one event (never blocks the request)."""
        self._pending.append(usage)

    async def start(self) -> None:
        """Start the background flusher."""
        self._task = asyncio.create_task(self._loop(), name="ledger-writer")

    async def stop(self) -> None:
        """Stop the flusher and write what is left."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.flush()

    async def flush(self) -> None:
        """Write every pending event now."""
        while self._pending:
            rows, self._pending = self._pending[: self._batch], self._pending[self._batch :]
            try:
                async with self._sessions.begin() as session:
                    stmt = insert(UsageEvent).on_conflict_do_nothing(index_elements=["request_id"])
                    await session.execute(stmt, [asdict(r) for r in rows])
            except Exception:
                self._pending[:0] = rows  # keep them for the next round
                raise

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self.flush()
            except Exception:
                log.exception("ledger flush failed; will retry")
