"""Stored responses (``store: true`` on ``/v1/responses``): kept ``responses_ttl_days`` so a
later request can go on from one (``previous_response_id``) and its tenant can read or delete
it. A tenant table (row-level security, migration 0028): each access is a transaction confined
to the tenant, so another tenant's id is not found. The response and its input items are
tenant data (prompts, answers), so the row holds them sealed (AES-256-GCM under a key derived
from the server secret, as the idempotency store's bodies), its tenant and id the associated
data: a sealed value moved to another row does not open."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import msgspec
from sqlalchemy import DateTime, ForeignKey, LargeBinary, String, delete, func
from sqlalchemy.orm import Mapped, mapped_column

from kiln_platform.db.engine import tenant_transaction
from kiln_platform.db.tables import Base
from kiln_platform.errors import NotFound
from kiln_platform.sealing import Seal

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

    from kiln_platform.gateway.responses_schemas import ResponseObject


class StoredResponse(Base):
    """A response as answered, and the input items it answered, sealed."""

    __tablename__ = "responses"
    id: Mapped[str] = mapped_column(String(80), primary_key=True)
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    sealed: Mapped[bytes] = mapped_column(LargeBinary)
    """``{"body": <the response object>, "history": <its input items: those of the responses
    it went on from (and their output), then its own>}`` as JSON, sealed."""
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class _Sealed(msgspec.Struct):
    """What a row's ``sealed`` holds, opened."""

    body: dict[str, Any]
    history: list[dict[str, Any]]


async def _row(
    session: AsyncSession, tenant_id: uuid.UUID, response_id: str, param: str
) -> StoredResponse:
    row = await session.get(StoredResponse, response_id)
    if row is None or row.tenant_id != tenant_id or row.expires_at <= datetime.now(UTC):
        raise NotFound(f"'{param}' names no stored response: '{response_id[:80]}'.", param=param)
    return row


def _listed(response_id: str, history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Input items as the API lists them: each with an id (its own, or ``<response>-in-<i>``)
    and a message's text as a content part."""
    items = []
    for i, given in enumerate(history):
        item = {"id": f"{response_id}-in-{i}"} | {k: v for k, v in given.items() if v is not None}
        if item.get("type", "message") == "message" and isinstance(item.get("content"), str):
            part = "output_text" if item.get("role") == "assistant" else "input_text"
            item["content"] = [{"type": part, "text": item["content"]}]
        items.append(item)
    return items


class ResponseStore:
    """Tenants' stored responses: written, read back, paged and deleted."""

    def __init__(
        self, sessions: async_sessionmaker[AsyncSession], secret: bytes, ttl_days: float
    ) -> None:
        self._sessions = sessions
        self._seal = Seal(secret, b"kiln stored responses v1")
        self._ttl = timedelta(days=ttl_days)

    async def _open(self, tenant_id: uuid.UUID, response_id: str, param: str) -> _Sealed:
        async with tenant_transaction(self._sessions, tenant_id) as session:
            row = await _row(session, tenant_id, response_id, param)
        plain = self._seal.open(row.sealed, f"{tenant_id}/{response_id}".encode())
        return msgspec.json.decode(plain, type=_Sealed)

    async def conversation(self, tenant_id: uuid.UUID, response_id: str) -> list[dict[str, Any]]:
        """What a request with ``previous_response_id`` goes on from: the stored response's
        input items, then its output items (which read as input items too)."""
        kept = await self._open(tenant_id, response_id, "previous_response_id")
        return [*kept.history, *kept.body["output"]]

    async def save(
        self, tenant_id: uuid.UUID, response: ResponseObject, history: list[dict[str, Any]]
    ) -> None:
        """Keep ``response`` (and drop the tenant's expired ones, in the same transaction)."""
        now = datetime.now(UTC)
        plain = msgspec.json.encode({"body": response, "history": history})
        sealed = self._seal.seal(plain, f"{tenant_id}/{response.id}".encode())
        async with tenant_transaction(self._sessions, tenant_id) as session:
            await session.execute(
                delete(StoredResponse).where(
                    StoredResponse.tenant_id == tenant_id, StoredResponse.expires_at <= now
                )
            )
            session.add(StoredResponse(id=response.id, tenant_id=tenant_id, sealed=sealed,
                                       expires_at=now + self._ttl))  # fmt: skip

    async def fetch(self, tenant_id: uuid.UUID, response_id: str) -> dict[str, Any]:
        """The stored response object (``GET /v1/responses/{id}``)."""
        return (await self._open(tenant_id, response_id, "response_id")).body

    async def input_items(
        self, tenant_id: uuid.UUID, response_id: str, *, after: str | None, limit: int,
        order: str,
    ) -> dict[str, Any]:  # fmt: skip
        """A page of the input items a stored response answered (those it went on from
        first), ``GET /v1/responses/{id}/input_items``: newest first unless ``order`` is
        ``asc``."""
        kept = await self._open(tenant_id, response_id, "response_id")
        items = _listed(response_id, kept.history)[:: -1 if order == "desc" else 1]
        if after is not None:
            ids = [item["id"] for item in items]
            if after not in ids:
                raise NotFound(f"'after' names no input item of '{response_id}'.", param="after")
            items = items[ids.index(after) + 1 :]
        page = items[:limit]
        return {
            "object": "list", "data": page, "has_more": len(items) > limit,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
        }  # fmt: skip

    async def remove(self, tenant_id: uuid.UUID, response_id: str) -> dict[str, Any]:
        """Delete a stored response (``DELETE /v1/responses/{id}``)."""
        async with tenant_transaction(self._sessions, tenant_id) as session:
            await session.delete(await _row(session, tenant_id, response_id, "response_id"))
        return {"id": response_id, "object": "response", "deleted": True}
