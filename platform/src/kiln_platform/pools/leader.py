"""Leader election for the pool manager (issue 21): one gateway at a time sizes and reconciles
the pools; the others follow.

The leader holds a session-level PostgreSQL advisory lock on a connection of its own. The lock
lives as long as that session: a leader that dies (SIGKILL, lost network) loses it the moment
PostgreSQL drops the session, and a follower's next try (every ``retry_s``) takes it. The
leader checks its connection as often; a failed or slow check makes it a follower at once (if
the session is in fact alive, the lock is released with it when the connection is closed).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING

import structlog
from sqlalchemy import text

from kiln_platform.pools.fleet_policy import Term, lock_key, next_term

if TYPE_CHECKING:
    from collections.abc import Callable

    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

log = structlog.get_logger("kiln.pools")
LOCK_NAME = "kiln.pool-manager"
_TRY = text("SELECT pg_try_advisory_lock(:k)::int")


class LeaderElector:
    """Takes, keeps and gives up the pool manager's advisory lock."""

    def __init__(
        self, engine: AsyncEngine, gateway: str, *, retry_s: float = 1.0, name: str = LOCK_NAME
    ) -> None:
        self._engine = engine
        self.gateway = gateway
        """This gateway's name in the log."""
        self._key = lock_key(name)
        self._retry_s = retry_s
        self._conn: AsyncConnection | None = None
        self.term = Term(False, time.monotonic())
        self.changes = 0
        """Times this gateway became or stopped being the leader."""
        self.on_change: Callable[[bool], None] = lambda leader: None

    @property
    def leader(self) -> bool:
        """This gateway holds the lock (as of the last check)."""
        return self.term.leader

    async def check(self) -> bool:
        """Take the lock if free, or check that the session holding it is alive."""
        try:
            held = await asyncio.wait_for(self._held(), timeout=max(self._retry_s, 1.0))
        except Exception as exc:  # no database, a dead session, a slow check: not the leader
            if self.term.leader:
                log.warning("leader lost its database session", error=repr(exc))
            held = False
            await self._drop()
        self._set(next_term(self.term, held, time.monotonic()))
        return held

    async def _held(self) -> bool:
        if self._conn is None:
            self._conn = await self._engine.connect()
        if self.term.leader:  # the session is alive, so the lock is still ours
            held = await self._conn.scalar(text("SELECT 1"))
        else:
            held = await self._conn.scalar(_TRY, {"k": self._key})
        await self._conn.commit()  # the lock is the session's: it outlives the transaction
        return bool(held == 1)

    def _set(self, term: Term) -> None:
        if term is self.term:
            return
        self.term = term
        self.changes += 1
        log.info("pool manager leadership changed", leader=term.leader, gateway=self.gateway)
        self.on_change(term.leader)

    async def release(self) -> None:
        """Give the lock up (closing the session releases it) and become a follower."""
        await self._drop()
        self._set(next_term(self.term, False, time.monotonic()))

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        with contextlib.suppress(Exception):
            await conn.invalidate()  # not back to the pool: the session (and lock) must end
        with contextlib.suppress(Exception):
            await conn.close()
