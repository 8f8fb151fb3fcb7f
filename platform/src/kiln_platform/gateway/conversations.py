"""Conversations (OpenAI's Conversations API): a tenant's conversation and its items, which
``/v1/responses`` with ``conversation`` reads as the history and appends its input and output
to. Tenant tables under row-level security (migration 0031), each access a transaction confined
to the tenant; the metadata and every item sealed (AES-256-GCM, as stored responses), the
tenant, conversation and item ids the associated data. Items are kept once each, in order, so
a conversation costs its items, not its turns times its history. Kept until deleted."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import msgspec
import structlog
from sqlalchemy import BigInteger, DateTime, ForeignKey, Identity, LargeBinary, String, func, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Mapped, mapped_column

from kiln_platform.db.engine import tenant_transaction
from kiln_platform.db.tables import Base
from kiln_platform.errors import NotFound
from kiln_platform.gateway._items import page
from kiln_platform.sealing import Seal

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

log = structlog.get_logger(__name__)


class Conversation(Base):
    """A conversation: its metadata, sealed."""

    __tablename__ = "conversations"
    id: Mapped[str] = mapped_column(String(80), primary_key=True)
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    sealed: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class ConversationItem(Base):
    """One item of a conversation, sealed; ``position`` orders them."""

    __tablename__ = "conversation_items"
    conversation_id: Mapped[str] = mapped_column(
        ForeignKey("conversations.id", ondelete="CASCADE"), primary_key=True
    )
    id: Mapped[str] = mapped_column(String(120), primary_key=True)
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    position: Mapped[int] = mapped_column(BigInteger, Identity())
    sealed: Mapped[bytes] = mapped_column(LargeBinary)


class ConversationStore:
    """Tenants' conversations: created, read, changed, deleted; items added, listed, removed."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession], secret: bytes) -> None:
        self._sessions = sessions
        self._seal = Seal(secret, b"kiln conversations v1")

    def _body(self, row: Conversation) -> dict[str, Any]:
        meta = self._seal.open(row.sealed, f"{row.tenant_id}/{row.id}".encode())
        return {"id": row.id, "object": "conversation", "metadata": msgspec.json.decode(meta),
                "created_at": int(row.created_at.timestamp())}  # fmt: skip

    def _item(self, row: ConversationItem) -> dict[str, Any]:
        identity = f"{row.tenant_id}/{row.conversation_id}/{row.id}".encode()
        return msgspec.json.decode(self._seal.open(row.sealed, identity))  # type: ignore[no-any-return]

    def _add(self, session: AsyncSession, tenant_id: uuid.UUID, conversation_id: str,
             items: list[dict[str, Any]]) -> None:  # fmt: skip
        for item in items:
            identity = f"{tenant_id}/{conversation_id}/{item['id']}".encode()
            sealed = self._seal.seal(msgspec.json.encode(item), identity)
            session.add(ConversationItem(conversation_id=conversation_id, id=item["id"],
                                         tenant_id=tenant_id, sealed=sealed))  # fmt: skip

    async def create(
        self, tenant_id: uuid.UUID, metadata: dict[str, str], items: list[dict[str, Any]]
    ) -> dict[str, Any]:
        """``POST /v1/conversations``."""
        ident, now = f"conv_{uuid.uuid4().hex}", datetime.now(UTC)
        sealed = self._seal.seal(msgspec.json.encode(metadata), f"{tenant_id}/{ident}".encode())
        async with tenant_transaction(self._sessions, tenant_id) as session:
            session.add(Conversation(id=ident, tenant_id=tenant_id, sealed=sealed, created_at=now))
            await session.flush()
            self._add(session, tenant_id, ident, items)
        return {"id": ident, "object": "conversation", "metadata": metadata,
                "created_at": int(now.timestamp())}  # fmt: skip

    async def _row(
        self, session: AsyncSession, tenant_id: uuid.UUID, ident: str, param: str
    ) -> Conversation:
        row = await session.get(Conversation, ident)
        if row is None or row.tenant_id != tenant_id:
            raise NotFound(f"'{param}' names no conversation: '{ident[:80]}'.", param=param)
        return row

    async def fetch(self, tenant_id: uuid.UUID, ident: str) -> dict[str, Any]:
        """``GET /v1/conversations/{id}``."""
        async with tenant_transaction(self._sessions, tenant_id) as session:
            return self._body(await self._row(session, tenant_id, ident, "conversation_id"))

    async def update(
        self, tenant_id: uuid.UUID, ident: str, metadata: dict[str, str]
    ) -> dict[str, Any]:
        """``POST /v1/conversations/{id}``: its metadata replaced."""
        async with tenant_transaction(self._sessions, tenant_id) as session:
            row = await self._row(session, tenant_id, ident, "conversation_id")
            row.sealed = self._seal.seal(msgspec.json.encode(metadata),
                                         f"{tenant_id}/{ident}".encode())  # fmt: skip
            return self._body(row)

    async def remove(self, tenant_id: uuid.UUID, ident: str) -> dict[str, Any]:
        """``DELETE /v1/conversations/{id}``: it and its items."""
        async with tenant_transaction(self._sessions, tenant_id) as session:
            await session.delete(await self._row(session, tenant_id, ident, "conversation_id"))
        return {"id": ident, "object": "conversation.deleted", "deleted": True}

    async def items(self, tenant_id: uuid.UUID, ident: str, param: str) -> list[dict[str, Any]]:
        """Every item of the conversation, oldest first (404 naming ``param``)."""
        async with tenant_transaction(self._sessions, tenant_id) as session:
            await self._row(session, tenant_id, ident, param)
            rows = await session.scalars(
                select(ConversationItem)
                .where(ConversationItem.conversation_id == ident)
                .order_by(ConversationItem.position)
            )
            return [self._item(row) for row in rows]

    async def append(
        self, tenant_id: uuid.UUID, ident: str, items: list[dict[str, Any]], param: str
    ) -> list[dict[str, Any]]:
        """Add items after the others (404 naming ``param`` if the conversation is gone)."""
        async with tenant_transaction(self._sessions, tenant_id) as session:
            await self._row(session, tenant_id, ident, param)
            self._add(session, tenant_id, ident, items)
        return items

    async def join(
        self, tenant_id: uuid.UUID, ident: str, turn: list[dict[str, Any]], response_id: str
    ) -> None:
        """Add a response's turn (its input items, then its output) to the conversation its
        request named. The answer is made and billed by now: a conversation deleted meanwhile,
        or a database that fails, is logged and the answer sent."""
        try:
            await self.append(tenant_id, ident, turn, "conversation")
        except (SQLAlchemyError, OSError, NotFound):
            log.warning("conversation not added to", response_id=response_id, exc_info=True)

    async def page(self, tenant_id: uuid.UUID, ident: str, *, after: str | None, limit: int,
                   order: str) -> dict[str, Any]:  # fmt: skip
        """``GET /v1/conversations/{id}/items``: newest first unless ``order`` is ``asc``; one
        index range (``position``), so a page costs its items, not the conversation's."""
        column, rows = ConversationItem.position, ConversationItem
        async with tenant_transaction(self._sessions, tenant_id) as session:
            await self._row(session, tenant_id, ident, "conversation_id")
            query = select(rows).where(rows.conversation_id == ident)
            if after is not None:
                start = await session.get(rows, (ident, after))
                if start is None:
                    raise NotFound(f"'after' names no item of '{ident}'.", param="after")
                query = query.where(column > start.position if order == "asc"
                                    else column < start.position)  # fmt: skip
            ordered = column.asc() if order == "asc" else column.desc()
            found = [self._item(r) for r in await session.scalars(
                query.order_by(ordered).limit(limit + 1))]  # fmt: skip
        return page(found, None, limit, f"'{ident}'")

    async def item(self, tenant_id: uuid.UUID, ident: str, item_id: str) -> dict[str, Any]:
        """``GET /v1/conversations/{id}/items/{item_id}``."""
        async with tenant_transaction(self._sessions, tenant_id) as session:
            await self._row(session, tenant_id, ident, "conversation_id")
            row = await session.get(ConversationItem, (ident, item_id))
            if row is None:
                raise NotFound(f"'item_id' names no item of '{ident}'.", param="item_id")
            return self._item(row)

    async def remove_item(self, tenant_id: uuid.UUID, ident: str, item_id: str) -> dict[str, Any]:
        """``DELETE /v1/conversations/{id}/items/{item_id}``: the conversation is returned."""
        async with tenant_transaction(self._sessions, tenant_id) as session:
            row = await self._row(session, tenant_id, ident, "conversation_id")
            item = await session.get(ConversationItem, (ident, item_id))
            if item is None:
                raise NotFound(f"'item_id' names no item of '{ident}'.", param="item_id")
            await session.delete(item)
            return self._body(row)
