"""Failed sign-ins, counted per email and per client address over a sliding window in
PostgreSQL, so every gateway process shares the count: past the limit, sign-in answers 429 until
enough failures leave the window (checked before the password, so a locked account cannot be
probed). Times are the database's, one clock for all gateways."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

from sqlalchemy import Interval, delete, func, insert, select, type_coerce

from kiln_platform.db.tables import SignInFailure

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker


class SignInThrottle:
    """At most ``limit`` failures per email, ``10 * limit`` per client address, in 15 minutes."""

    WINDOW = timedelta(minutes=15)

    def __init__(self, limit: int) -> None:
        self._limit = limit

    def _limits(self, email: str, source: str) -> dict[str, int]:
        return {f"email:{email.lower()}": self._limit, f"source:{source}": 10 * self._limit}

    async def retry_after(
        self, sessions: async_sessionmaker[AsyncSession], email: str, source: str
    ) -> float:
        """Seconds before this email may try again from this address (0: now): until fewer
        than the limit of its failures are left in the window."""
        wait = 0.0
        async with sessions() as session:
            for key, limit in self._limits(email, source).items():
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

    async def failed(
        self, sessions: async_sessionmaker[AsyncSession], email: str, source: str
    ) -> None:
        """Count a failed sign-in (and drop the keys' failures that left the window)."""
        keys = list(self._limits(email, source))
        async with sessions.begin() as session:
            await session.execute(
                delete(SignInFailure).where(
                    SignInFailure.key.in_(keys),
                    SignInFailure.failed_at <= func.now() - self.WINDOW,
                )
            )
            await session.execute(insert(SignInFailure), [{"key": key} for key in keys])

    async def succeeded(self, sessions: async_sessionmaker[AsyncSession], email: str) -> None:
        """The email signed in: its failures are forgotten (the address's are not)."""
        async with sessions.begin() as session:
            await session.execute(
                delete(SignInFailure).where(SignInFailure.key == f"email:{email.lower()}")
            )
