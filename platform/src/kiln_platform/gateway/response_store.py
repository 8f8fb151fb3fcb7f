"""Stored responses (``store: true`` on ``/v1/responses``): kept ``responses_ttl_days`` so a
later request can go on from one (``previous_response_id``) and its tenant can read or delete
it. A tenant table (row-level security, migration 0028): each access is a transaction confined
to the tenant, so another tenant's id is not found."""

from __future__ import annotations

import uuid
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import msgspec
from sqlalchemy import DateTime, ForeignKey, String, delete, func
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from kiln_platform.db.engine import confine
from kiln_platform.db.tables import Base
from kiln_platform.errors import NotFound

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from sqlalchemy.ext.asyncio import AsyncSession

    from kiln_platform.context import Kiln
    from kiln_platform.gateway.responses_schemas import ResponseObject


class StoredResponse(Base):
    """A response as answered, and the input items it answered."""

    __tablename__ = "responses"
    id: Mapped[str] = mapped_column(String(80), primary_key=True)
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    body: Mapped[dict[str, Any]] = mapped_column(JSONB)
    """The response object, as the client got it."""
    history: Mapped[list[dict[str, Any]]] = mapped_column(JSONB)
    """Its input items: those of the responses it went on from (and their output), then its
    own."""
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


@asynccontextmanager
async def _tenant_tx(kiln: Kiln, tenant_id: uuid.UUID) -> AsyncIterator[AsyncSession]:
    async with kiln.db.sessions.begin() as session:
        await confine(session, tenant_id)
        yield session


async def _row(
    session: AsyncSession, tenant_id: uuid.UUID, response_id: str, param: str
) -> StoredResponse:
    row = await session.get(StoredResponse, response_id)
    if row is None or row.tenant_id != tenant_id or row.expires_at <= datetime.now(UTC):
        raise NotFound(f"'{param}' names no stored response: '{response_id[:80]}'.", param=param)
    return row


async def conversation(kiln: Kiln, tenant_id: uuid.UUID, response_id: str) -> list[dict[str, Any]]:
    """What a request with ``previous_response_id`` goes on from: the stored response's input
    items, then its output items (which read as input items too)."""
    async with _tenant_tx(kiln, tenant_id) as session:
        row = await _row(session, tenant_id, response_id, "previous_response_id")
        return [*row.history, *row.body["output"]]


async def save(
    kiln: Kiln, tenant_id: uuid.UUID, response: ResponseObject, history: list[dict[str, Any]]
) -> None:
    """Keep ``response`` (and drop the tenant's expired ones, in the same transaction)."""
    now = datetime.now(UTC)
    async with _tenant_tx(kiln, tenant_id) as session:
        await session.execute(
            delete(StoredResponse).where(
                StoredResponse.tenant_id == tenant_id, StoredResponse.expires_at <= now
            )
        )
        session.add(
            StoredResponse(
                id=response.id, tenant_id=tenant_id, body=msgspec.to_builtins(response),
                history=history, expires_at=now + timedelta(days=kiln.settings.responses_ttl_days),
            )
        )  # fmt: skip


async def fetch(kiln: Kiln, tenant_id: uuid.UUID, response_id: str) -> dict[str, Any]:
    """The stored response object (``GET /v1/responses/{id}``)."""
    async with _tenant_tx(kiln, tenant_id) as session:
        return (await _row(session, tenant_id, response_id, "response_id")).body


async def remove(kiln: Kiln, tenant_id: uuid.UUID, response_id: str) -> dict[str, Any]:
    """Delete a stored response (``DELETE /v1/responses/{id}``)."""
    async with _tenant_tx(kiln, tenant_id) as session:
        await session.delete(await _row(session, tenant_id, response_id, "response_id"))
    return {"id": response_id, "object": "response", "deleted": True}
