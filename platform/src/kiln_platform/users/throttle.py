"""The console's sign-in throttle: failed sign-ins, counted per email and per client address
over a sliding window in PostgreSQL, so every gateway process shares the count: past the limit,
sign-in answers 429 until enough failures leave the window. Times are the database's, one clock
for all gateways.

An attempt is counted as a failure *before* its password is checked (and forgiven if it turns
out right): a transaction takes the keys' advisory locks, counts, and records the attempt only
if it is under the limit. Two hundred parallel guesses thus get at most ``limit`` checks; the
rest are refused without one, and a locked account cannot be probed.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from sqlalchemy import Interval, delete, func, insert, or_, select, type_coerce

from kiln_platform.db.tables import SignInFailure

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker


@dataclass(frozen=True)
class Attempt:
    """A sign-in attempt: refused for ``wait`` seconds, or counted (as rows ``ids``)."""

    wait: float
    ids: tuple[int, ...] = ()


class SignInThrottle:
    """At most ``limit`` failures per email, ``10 * limit`` per client address, in 15 minutes."""

    WINDOW = timedelta(minutes=15)

    def __init__(self, limit: int) -> None:
        self._limit = limit

    def _limits(self, email: str, source: str) -> dict[str, int]:
        return {f"email:{email.lower()}": self._limit, f"source:{source}": 10 * self._limit}

    async def attempt(
        self, sessions: async_sessionmaker[AsyncSession], email: str, source: str
    ) -> Attempt:
        """Count an attempt as a failure before its password is checked, unless the email or
        the address is already at its limit (then: how long to wait, nothing counted)."""
        limits = self._limits(email, source)
        async with sessions.begin() as session:
            for key in sorted(limits):  # one order for everyone: no deadlock
                await session.execute(select(func.pg_advisory_xact_lock(_lock_id(key))))
            await self._forget_old(session, list(limits))
            wait = await self._wait(session, limits)
            if wait > 0:
                return Attempt(wait)
            ids = await session.scalars(
                insert(SignInFailure).returning(SignInFailure.id), [{"key": k} for k in limits]
            )
            return Attempt(0.0, tuple(ids))

    async def retry_after(
        self, sessions: async_sessionmaker[AsyncSession], email: str, source: str
    ) -> float:
        """Seconds before this email may try again from this address (0: now)."""
        async with sessions() as session:
            return await self._wait(session, self._limits(email, source))

    async def _wait(self, session: AsyncSession, limits: dict[str, int]) -> float:
        """Until fewer than the limit of each key's failures are left in the window."""
        wait = 0.0
        for key, limit in limits.items():
            left = type_coerce(SignInFailure.failed_at + self.WINDOW - func.now(), Interval)
            leaves = await session.scalar(
                select(left)
                .where(SignInFailure.key == key,
                       SignInFailure.failed_at > func.now() - self.WINDOW)
                .order_by(SignInFailure.failed_at.desc())
                .offset(limit - 1)
                .limit(1)
            )  # fmt: skip
            if leaves is not None:
                wait = max(wait, leaves.total_seconds())
        return wait

    async def _forget_old(self, session: AsyncSession, keys: list[str]) -> None:
        await session.execute(
            delete(SignInFailure).where(
                SignInFailure.key.in_(keys), SignInFailure.failed_at <= func.now() - self.WINDOW
            )
        )

    async def failed(
        self, sessions: async_sessionmaker[AsyncSession], email: str, source: str
    ) -> None:
        """Count a failed sign-in (whatever the limit says)."""
        keys = list(self._limits(email, source))
        async with sessions.begin() as session:
            await self._forget_old(session, keys)
            await session.execute(insert(SignInFailure), [{"key": key} for key in keys])

    async def succeeded(
        self, sessions: async_sessionmaker[AsyncSession], email: str, attempt: Attempt
    ) -> None:
        """The email signed in: its failures are forgotten, and so is this attempt (the
        address's earlier failures are not)."""
        async with sessions.begin() as session:
            await session.execute(
                delete(SignInFailure).where(
                    or_(SignInFailure.key == f"email:{email.lower()}",
                        SignInFailure.id.in_(attempt.ids))
                )
            )  # fmt: skip


def _lock_id(key: str) -> object:
    """The advisory lock of a throttle key (a 64-bit hash of it, namespaced)."""
    return func.hashtextextended(f"kiln-signin/{key}", 0)
