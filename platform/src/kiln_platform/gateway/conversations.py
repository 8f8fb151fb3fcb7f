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
from kiln_platform.errors import BadRequest, NotFound
from kiln_platform.gateway import _response_input
from kiln_platform.gateway._items import page, with_parts
from kiln_platform.gateway.responses_schemas import InputItem
from kiln_platform.sealing import Seal

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

    from kiln_platform.gateway.responses_schemas import ResponseObject

log = structlog.get_logger(__name__)

MAX_ITEMS = 20
"""Items one request may add (OpenAI's bound)."""
_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco"}


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


def metadata_of(given: Any, param: str = "metadata") -> dict[str, str]:
    """OpenAI's metadata: at most 16 string pairs, keys to 64 characters, values to 512."""
    if given is None:
        return {}
    if (
        not isinstance(given, dict)
        or len(given) > 16
        or not all(
            isinstance(k, str) and isinstance(v, str) and len(k) <= 64 and len(v) <= 512
            for k, v in given.items()
        )
    ):
        raise BadRequest(f"'{param}' takes at most 16 string pairs (keys to 64 characters, "
                         "values to 512).", param=param)  # fmt: skip
    return dict(given)


def conversation_id(given: Any, previous_response_id: str | None) -> str | None:
    """The conversation a ``/v1/responses`` request names (an id, or ``{"id": …}``), if any."""
    if given is None:
        return None
    ident = given.get("id") if isinstance(given, dict) else given
    if not isinstance(ident, str) or not ident:
        raise BadRequest("'conversation' is a conversation id or {\"id\": <id>}.",
                         param="conversation")  # fmt: skip
    if previous_response_id is not None:
        raise BadRequest("Set one of 'conversation' and 'previous_response_id'.",
                         param="conversation")  # fmt: skip
    return ident


def named(given: Any) -> dict[str, str] | None:
    """A response's ``conversation``: ``{"id": …}`` of the one its request named, or None."""
    ident = conversation_id(given, None)
    return None if ident is None else {"id": ident}


def items_of(
    given: Any, param: str = "items", most: int | None = MAX_ITEMS
) -> list[dict[str, Any]]:
    """Input items to add (at most ``most``), checked as ``/v1/responses`` input is (so a
    conversation holds no item a response could not read), each with an id of its own and a
    message's text as a content part, as they are listed."""
    if not isinstance(given, list) or (most is not None and len(given) > most):
        raise BadRequest(f"'{param}' is a list of at most {most} items.", param=param)
    try:
        items = msgspec.convert(given, list[InputItem])
        _response_input.messages(items)
    except msgspec.ValidationError as exc:
        raise BadRequest(f"{exc} (in '{param}').", param=param) from None
    except BadRequest as exc:
        named = exc.param and exc.param.replace("input[", f"{param}[", 1)
        raise BadRequest(exc.message.replace("'input[", f"'{param}[", 1), param=named) from None
    return [
        listed({**{k: v for k, v in msgspec.to_builtins(item).items() if v is not None},
                "id": f"{_PREFIX[item.type]}_{uuid.uuid4().hex}"})
        for item in items
    ]  # fmt: skip


def listed(item: dict[str, Any]) -> dict[str, Any]:
    """An item as the API lists it: a message's text as a content part, its status set."""
    if item.get("type", "message") != "message":
        return item
    return {"type": "message", "status": "completed", **with_parts(item)}


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

    async def join(self, tenant_id: uuid.UUID, conversation: Any, given: list[dict[str, Any]],
                   response: ResponseObject) -> None:  # fmt: skip
        """Add a response's input items (``given``) and output to the conversation its request
        named, if any. The answer is made and billed by now: a conversation deleted meanwhile,
        or a database that fails, is logged and the answer sent."""
        ident = conversation_id(conversation, None)
        if ident is None:
            return
        turn = [*items_of(given, "input", None), *msgspec.to_builtins(response.output)]
        try:
            await self.append(tenant_id, ident, turn, "conversation")
        except (SQLAlchemyError, OSError, NotFound):
            log.warning("conversation not added to", response_id=response.id, exc_info=True)

    async def page(self, tenant_id: uuid.UUID, ident: str, *, after: str | None, limit: int,
                   order: str) -> dict[str, Any]:  # fmt: skip
        """``GET /v1/conversations/{id}/items``: newest first unless ``order`` is ``asc``."""
        items = await self.items(tenant_id, ident, "conversation_id")
        return page(items[:: -1 if order == "desc" else 1], after, limit, f"'{ident}'")

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
