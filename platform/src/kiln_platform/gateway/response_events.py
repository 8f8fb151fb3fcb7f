"""A streamed background response's events, stored as its run makes them: each write appends
the events made since the last as one run (a ``response_events`` row, sealed, its tenant, id
and first number the associated data; migration 0036), so a long stream writes its bytes once
(a rewrite of the whole list at each write cost their square), and a reader on another gateway
opens the runs it has not read, and the last."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from sqlalchemy import ForeignKey, Integer, LargeBinary, String, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Mapped, mapped_column

from kiln_platform.db.tables import Base

if TYPE_CHECKING:
    from collections.abc import Sequence

    from sqlalchemy.ext.asyncio import AsyncSession

    from kiln_platform.sealing import Seal


class EventRun(Base):
    """Events ``first`` to ``until`` (exclusive) of a streamed background response, sealed."""

    __tablename__ = "response_events"
    response_id: Mapped[str] = mapped_column(
        String(80), ForeignKey("responses.id", ondelete="CASCADE"), primary_key=True
    )
    first: Mapped[int] = mapped_column(Integer, primary_key=True)
    until: Mapped[int] = mapped_column(Integer)
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    sealed: Mapped[bytes] = mapped_column(LargeBinary)


def _data(tenant_id: uuid.UUID, response_id: str, first: int) -> bytes:
    return f"{tenant_id}/{response_id}/events/{first}".encode()


def split(plain: bytes) -> list[bytes]:
    """Server-sent events written one after another, each with its blank line."""
    return [event + b"\n\n" for event in plain.split(b"\n\n") if event]


async def append(
    session: AsyncSession, seal: Seal, tenant_id: uuid.UUID, response_id: str, *, first: int,
    events: Sequence[bytes],
) -> None:  # fmt: skip
    """Store ``events``, numbered from ``first``. A write that is tried again (its first
    seemed to fail) starts at the same number with as many events or more: it replaces the
    run."""
    if not events:
        return
    sealed = seal.seal(b"".join(events), _data(tenant_id, response_id, first))
    upsert = insert(EventRun).values(response_id=response_id, first=first, tenant_id=tenant_id,
                                     until=first + len(events), sealed=sealed)  # fmt: skip
    await session.execute(upsert.on_conflict_do_update(
        index_elements=[EventRun.response_id, EventRun.first],
        set_={"until": upsert.excluded.until, "sealed": upsert.excluded.sealed},
    ))  # fmt: skip


async def read(
    session: AsyncSession, seal: Seal, tenant_id: uuid.UUID, response_id: str, start: int
) -> tuple[int, list[bytes]]:
    """The stored events from the run that holds number ``start`` (or from the last run, if
    none does) to the end, and the number of the first of them."""
    runs = (await session.execute(
        select(EventRun.first, EventRun.until).where(EventRun.response_id == response_id)
        .order_by(EventRun.first)
    )).all()  # fmt: skip
    if not runs:
        return 0, []
    wanted = [first for first, until in runs if until > start] or [runs[-1].first]
    sealed = await session.execute(
        select(EventRun.first, EventRun.sealed)
        .where(EventRun.response_id == response_id, EventRun.first >= wanted[0])
        .order_by(EventRun.first)
    )  # fmt: skip
    events = [
        event
        for first, blob in sealed
        for event in split(seal.open(blob, _data(tenant_id, response_id, first)))
    ]
    return wanted[0], events
