"""Requests per API key (or OAuth client) per UTC day, for the keys and clients pages.

Read through ``ix_usage_events_key_created`` / ``ix_usage_events_client_created`` (migration
0014): one index range per credential over the last few days, never a scan of the tenant's usage.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING

from sqlalchemy import Date, Select, cast, func, select

from kiln_platform.db.tables import UsageEvent

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession


@dataclass(frozen=True, slots=True)
class DailyUsage:
    """Requests per day for one credential, oldest day first."""

    days: tuple[date, ...]
    requests: tuple[int, ...]

    @property
    def total(self) -> int:
        """Requests over all the days."""
        return sum(self.requests)


async def daily_requests(
    session: AsyncSession, ids: Iterable[uuid.UUID], *, client: bool = False, days: int = 7
) -> dict[uuid.UUID, DailyUsage]:
    """Requests per UTC day over the last ``days`` days (today included) for each key id, or
    for each OAuth client id with ``client``; every id gets an entry, zeros included."""
    wanted = list(ids)
    today = datetime.now(UTC).date()
    span = tuple(today - timedelta(days=n) for n in range(days - 1, -1, -1))
    counts: dict[tuple[uuid.UUID, date], int] = {}
    if wanted:
        since = datetime.combine(span[0], datetime.min.time(), UTC)
        rows = await session.execute(daily_query(wanted, since, client=client))
        counts = {(ref, d): n for ref, d, n in rows if ref is not None}
    return {ref: DailyUsage(span, tuple(counts.get((ref, d), 0) for d in span)) for ref in wanted}


def daily_query(
    ids: list[uuid.UUID], since: datetime, *, client: bool = False
) -> Select[uuid.UUID | None, date, int]:
    """(credential id, UTC day, requests) since ``since``: an index range per credential."""
    column = UsageEvent.oauth_client_id if client else UsageEvent.api_key_id
    day = cast(func.timezone("UTC", UsageEvent.created_at), Date)
    return (
        select(column, day, func.count())
        .where(column.in_(ids), UsageEvent.created_at >= since)
        .group_by(column, day)
    )


async def last_used(
    session: AsyncSession, client_ids: Iterable[uuid.UUID]
) -> dict[uuid.UUID, datetime]:
    """When each OAuth client's tokens last made a request (clients with none are absent)."""
    wanted = list(client_ids)
    if not wanted:
        return {}
    rows = await session.execute(
        select(UsageEvent.oauth_client_id, func.max(UsageEvent.created_at))
        .where(UsageEvent.oauth_client_id.in_(wanted))
        .group_by(UsageEvent.oauth_client_id)
    )
    return {ref: at for ref, at in rows if ref is not None}
