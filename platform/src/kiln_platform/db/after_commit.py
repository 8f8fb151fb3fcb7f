"""Work a service defers until its transaction commits: forgetting what a cache holds about
what it changed. Before the commit, a concurrent request could fill the cache again with the
old state; after a rollback there is nothing to forget."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

Action = Callable[[], Awaitable[object] | None]
_KEY = "kiln.after_commit"


def defer(session: AsyncSession, action: Action) -> None:
    """Run ``action`` once ``session``'s transaction has committed (``run``)."""
    session.info.setdefault(_KEY, []).append(action)


async def run(session: AsyncSession) -> None:
    """Run what was deferred, in order (the owner of the transaction calls this after it)."""
    for action in session.info.pop(_KEY, []):
        result = action()
        if inspect.isawaitable(result):
            await result
