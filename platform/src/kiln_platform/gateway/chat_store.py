"""Stored chat completions (``store: true`` on ``/v1/chat/completions``, OpenAI's stored
completions): kept ``responses_ttl_days``, listed (by model and metadata), read, tagged and
deleted by their tenant. A tenant table under row-level security (migration 0032), each access a
transaction confined to the tenant; the completion and the messages it answered are tenant data,
so they are sealed (AES-256-GCM, as stored responses), the tenant and id the associated data.
The model and the times are in the clear: the list filters and pages by them."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import msgspec
from sqlalchemy import DateTime, ForeignKey, LargeBinary, String, delete, func, select, tuple_
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Mapped, mapped_column

from kiln_platform.db.engine import tenant_transaction
from kiln_platform.db.tables import Base
from kiln_platform.errors import NotFound
from kiln_platform.gateway._items import page, text_of
from kiln_platform.sealing import Seal

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

SCAN = 100
"""Rows read at a time while a metadata filter looks for a page's worth."""


class StoredChat(Base):
    """A chat completion as answered, and the messages it answered, sealed."""

    __tablename__ = "chat_completions"
    id: Mapped[str] = mapped_column(String(120), primary_key=True)
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    model: Mapped[str] = mapped_column(String(200))
    sealed: Mapped[bytes] = mapped_column(LargeBinary)
    """``{"body": <the chat.completion, with its metadata>, "messages": <the request's>}``."""
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class Kept(msgspec.Struct):
    """A stored completion, opened: the ``chat.completion`` and the messages it answered."""

    body: dict[str, Any]
    messages: list[dict[str, Any]]


def message_item(completion_id: str, i: int, given: dict[str, Any]) -> dict[str, Any]:
    """A request message as ``…/messages`` lists it: an id, its text as ``content`` and, if it
    was given as parts, the parts as ``content_parts``."""
    content = given.get("content")
    parts = content if isinstance(content, list) else None
    text = content if parts is None else text_of(parts) or None
    kept = {k: v for k, v in given.items() if k != "content" and v is not None}
    return {"id": f"{completion_id}-{i}", **kept, "content": text, "content_parts": parts}


class ChatStore:
    """Tenants' stored chat completions."""

    def __init__(
        self, sessions: async_sessionmaker[AsyncSession], secret: bytes, ttl_days: float
    ) -> None:
        self._sessions = sessions
        self._seal = Seal(secret, b"kiln stored chat completions v1")
        self._ttl = timedelta(days=ttl_days)

    def _opened(self, row: StoredChat) -> Kept:
        plain = self._seal.open(row.sealed, f"{row.tenant_id}/{row.id}".encode())
        return msgspec.json.decode(plain, type=Kept)

    def _sealed(self, row: StoredChat, kept: Kept) -> bytes:
        return self._seal.seal(msgspec.json.encode(kept), f"{row.tenant_id}/{row.id}".encode())

    async def _row(self, session: AsyncSession, tenant_id: uuid.UUID, ident: str,
                   param: str = "completion_id") -> StoredChat:  # fmt: skip
        row = await session.get(StoredChat, ident)
        if row is None or row.tenant_id != tenant_id or row.expires_at <= datetime.now(UTC):
            raise NotFound(f"'{param}' names no stored chat completion: '{ident[:120]}'.",
                           param=param)  # fmt: skip
        return row

    async def save(
        self, tenant_id: uuid.UUID, body: dict[str, Any], messages: list[dict[str, Any]]
    ) -> None:
        """Keep a completion (once: a batch line run again keeps its first), and drop the
        tenant's expired ones in the same transaction."""
        now = datetime.now(UTC)
        row = StoredChat(id=body["id"], tenant_id=tenant_id, model=body["model"])
        sealed = self._sealed(row, Kept(body=body, messages=messages))
        async with tenant_transaction(self._sessions, tenant_id) as session:
            await session.execute(delete(StoredChat).where(
                StoredChat.tenant_id == tenant_id, StoredChat.expires_at <= now))  # fmt: skip
            await session.execute(insert(StoredChat).values(
                id=row.id, tenant_id=tenant_id, model=row.model, sealed=sealed, created_at=now,
                expires_at=now + self._ttl,
            ).on_conflict_do_nothing())  # fmt: skip

    async def kept(self, tenant_id: uuid.UUID, ident: str) -> Kept:
        """A stored completion and its messages (a 404 naming ``completion_id``)."""
        async with tenant_transaction(self._sessions, tenant_id) as session:
            return self._opened(await self._row(session, tenant_id, ident))

    async def fetch(self, tenant_id: uuid.UUID, ident: str) -> dict[str, Any]:
        """``GET /v1/chat/completions/{id}``."""
        return (await self.kept(tenant_id, ident)).body

    async def update(
        self, tenant_id: uuid.UUID, ident: str, metadata: dict[str, str]
    ) -> dict[str, Any]:
        """``POST /v1/chat/completions/{id}``: its metadata replaced."""
        async with tenant_transaction(self._sessions, tenant_id) as session:
            row = await self._row(session, tenant_id, ident)
            await session.refresh(row, with_for_update=True)
            kept = self._opened(row)
            kept.body["metadata"] = metadata
            row.sealed = self._sealed(row, kept)
            return kept.body

    async def remove(self, tenant_id: uuid.UUID, ident: str) -> dict[str, Any]:
        """``DELETE /v1/chat/completions/{id}``."""
        async with tenant_transaction(self._sessions, tenant_id) as session:
            await session.delete(await self._row(session, tenant_id, ident))
        return {"id": ident, "object": "chat.completion.deleted", "deleted": True}

    async def messages(self, tenant_id: uuid.UUID, ident: str, *, after: str | None, limit: int,
                       order: str) -> dict[str, Any]:  # fmt: skip
        """``GET /v1/chat/completions/{id}/messages``: the messages it answered, in the order
        sent unless ``order`` is ``desc``."""
        kept = await self.kept(tenant_id, ident)
        listed = [message_item(ident, i, m) for i, m in enumerate(kept.messages)]
        return page(listed[:: -1 if order == "desc" else 1], after, limit, f"'{ident}'")

    async def page(
        self, tenant_id: uuid.UUID, *, model: str | None, metadata: dict[str, str],
        after: str | None, limit: int, order: str,
    ) -> dict[str, Any]:  # fmt: skip
        """``GET /v1/chat/completions``: a list object of ``entries``' bodies."""
        found = await self.entries(tenant_id, model=model, metadata=metadata, after=after,
                                   limit=limit, order=order)  # fmt: skip
        return page([kept.body for kept in found], None, limit, "the list")

    async def entries(
        self, tenant_id: uuid.UUID, *, model: str | None = None,
        metadata: dict[str, str] | None = None, after: str | None = None, limit: int = 20,
        order: str = "desc",
    ) -> list[Kept]:  # fmt: skip
        """Up to ``limit + 1`` completions (one more: there are more) after the ``after`` one,
        oldest first unless ``order`` is ``desc``, of ``model`` and carrying every
        ``metadata`` pair if given. One index range; a metadata filter reads on, ``SCAN`` rows
        at a time, until it has enough."""
        key = tuple_(StoredChat.created_at, StoredChat.id)
        query = select(StoredChat).where(
            StoredChat.tenant_id == tenant_id, StoredChat.expires_at > datetime.now(UTC)
        )
        if model is not None:
            query = query.where(StoredChat.model == model)
        ordered = [StoredChat.created_at, StoredChat.id]
        wanted, found = (metadata or {}).items(), []
        async with tenant_transaction(self._sessions, tenant_id) as session:
            if after is not None:
                start = await self._row(session, tenant_id, after, "after")
                mark = tuple_(start.created_at, start.id)
                query = query.where(key > mark if order == "asc" else key < mark)
            query = query.order_by(*(c.asc() if order == "asc" else c.desc() for c in ordered))
            rows = await session.stream_scalars(query.execution_options(yield_per=SCAN))
            async for row in rows:
                kept = self._opened(row)
                if wanted <= kept.body.get("metadata", {}).items():
                    found.append(kept)
                if len(found) > limit:
                    break
            await rows.close()
        return found
