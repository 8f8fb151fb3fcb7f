"""Stored responses (``store: true`` on ``/v1/responses``): kept ``responses_ttl_days`` so a
later request can go on from one (``previous_response_id``) and its tenant can read or delete
it. A tenant table (row-level security, migration 0028): each access is a transaction confined
to the tenant, so another tenant's id is not found. The response and its input items are
tenant data (prompts, answers), so the row holds them sealed (AES-256-GCM under a key derived
from the server secret, as the idempotency store's bodies), its tenant and id the associated
data: a sealed value moved to another row does not open.

A background response is stored ``queued`` and finished by the task that runs it
(``gateway.background``): its ``status`` is in the clear, so a cancel and the task's last write
settle by one conditional update, and its lease, renewed while it runs, makes one whose gateway
died read as ``failed`` (migration 0029). A streamed one keeps its events as they come
(``response_events``), so its stream resumes on any gateway."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import msgspec
from sqlalchemy import (
    DateTime,
    ForeignKey,
    LargeBinary,
    String,
    delete,
    func,
    select,
    tuple_,
    update,
)
from sqlalchemy.orm import Mapped, mapped_column

from kiln_platform.db.engine import tenant_transaction
from kiln_platform.db.tables import Base
from kiln_platform.errors import BadRequest, NotFound
from kiln_platform.gateway import response_events
from kiln_platform.gateway._items import page, with_parts
from kiln_platform.gateway.chat_store import SCAN
from kiln_platform.gateway.response_events import split
from kiln_platform.sealing import Seal

if TYPE_CHECKING:
    from collections.abc import Sequence

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
    status: Mapped[str] = mapped_column(String(16), server_default="completed")
    """The response's ``status`` (``LIVE`` ones still run: a background response)."""
    lease_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    """A live response's gateway renews this while it runs it; past it, the response failed."""
    events: Mapped[bytes | None] = mapped_column(LargeBinary)
    """Empty for a streamed background response (its events are in ``response_events``; one
    stored before migration 0036 has them here, sealed); null for any other response."""


LIVE = ("queued", "in_progress")
"""The statuses of a background response still running."""
LOST = "The server running this response stopped before it was done; create it again."


class Kept(msgspec.Struct):
    """What a row's ``sealed`` holds, opened: the response object and its input items."""

    body: dict[str, Any]
    history: list[dict[str, Any]]


async def _row(
    session: AsyncSession, tenant_id: uuid.UUID, response_id: str, param: str
) -> StoredResponse:
    row = await session.get(StoredResponse, response_id)
    if row is None or row.tenant_id != tenant_id or row.expires_at <= datetime.now(UTC):
        raise NotFound(f"'{param}' names no stored response: '{response_id[:80]}'.", param=param)
    return row


def _lost(kept: Kept) -> Kept:
    """A live response whose lease ran out reads as failed (its gateway died)."""
    error = {"code": "server_error", "message": LOST}
    return Kept(body=kept.body | {"status": "failed", "error": error}, history=kept.history)


def _running(row: StoredResponse) -> bool:
    """A live response whose lease has not run out (its status and lease are in the clear)."""
    return row.status in LIVE and (row.lease_until is None or row.lease_until > datetime.now(UTC))


def _events_data(row: StoredResponse) -> bytes:
    """The associated data of a row's sealed events: its tenant and id, and what they are."""
    return f"{row.tenant_id}/{row.id}/events".encode()


def _listed(response_id: str, history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Input items as the API lists them: each with an id (its own, or ``<response>-in-<i>``)
    and a message's text as a content part."""
    return [
        with_parts(
            {"id": f"{response_id}-in-{i}"} | {k: v for k, v in given.items() if v is not None}
        )
        for i, given in enumerate(history)
    ]


class ResponseStore:
    """Tenants' stored responses: written, read back, paged and deleted."""

    def __init__(
        self, sessions: async_sessionmaker[AsyncSession], secret: bytes, ttl_days: float
    ) -> None:
        self._sessions = sessions
        self._seal = Seal(secret, b"kiln stored responses v1")
        self._ttl = timedelta(days=ttl_days)

    def _opened(self, row: StoredResponse) -> Kept:
        plain = self._seal.open(row.sealed, f"{row.tenant_id}/{row.id}".encode())
        kept = msgspec.json.decode(plain, type=Kept)
        if row.status not in LIVE:
            return kept
        if not _running(row):
            return _lost(kept)
        return Kept(body=kept.body | {"status": row.status}, history=kept.history)

    def _sealed(
        self, tenant_id: uuid.UUID, response_id: str, body: Any, history: list[dict[str, Any]]
    ) -> bytes:
        plain = msgspec.json.encode({"body": body, "history": history})
        return self._seal.seal(plain, f"{tenant_id}/{response_id}".encode())

    async def _open(self, tenant_id: uuid.UUID, response_id: str, param: str) -> Kept:
        async with tenant_transaction(self._sessions, tenant_id) as session:
            row = await _row(session, tenant_id, response_id, param)
        return self._opened(row)

    async def conversation(self, tenant_id: uuid.UUID, response_id: str) -> list[dict[str, Any]]:
        """What a request with ``previous_response_id`` goes on from: the stored response's
        input items, then its output items (which read as input items too); a 400 while the
        response is still running."""
        kept = await self._open(tenant_id, response_id, "previous_response_id")
        if kept.body["status"] in LIVE:
            raise BadRequest(
                f"'previous_response_id' names a response still {kept.body['status']}: "
                "wait for it to finish.", param="previous_response_id",
            )  # fmt: skip
        return [*kept.history, *kept.body["output"]]

    async def save(
        self, tenant_id: uuid.UUID, response: ResponseObject, history: list[dict[str, Any]],
        lease_s: float | None = None, *, streamed: bool = False,
    ) -> None:  # fmt: skip
        """Keep ``response`` (and drop the tenant's expired ones, in the same transaction); a
        live one (``queued``) with a lease of ``lease_s``, its events kept at its end if
        ``streamed``."""
        now = datetime.now(UTC)
        sealed = self._sealed(tenant_id, response.id, response, history)
        lease = now + timedelta(seconds=lease_s) if lease_s is not None else None
        async with tenant_transaction(self._sessions, tenant_id) as session:
            await session.execute(
                delete(StoredResponse).where(
                    StoredResponse.tenant_id == tenant_id, StoredResponse.expires_at <= now
                )
            )
            session.add(StoredResponse(
                id=response.id, tenant_id=tenant_id, sealed=sealed, expires_at=now + self._ttl,
                status=response.status, lease_until=lease, events=b"" if streamed else None,
            ))  # fmt: skip

    async def renew(self, tenant_id: uuid.UUID, response_id: str, lease_s: float) -> bool:
        """Extend a live response's lease (it is ``in_progress`` from the first); False if it
        is live no more (cancelled, deleted)."""
        lease = datetime.now(UTC) + timedelta(seconds=lease_s)
        async with tenant_transaction(self._sessions, tenant_id) as session:
            renewed = await session.execute(
                update(StoredResponse)
                .where(StoredResponse.id == response_id, StoredResponse.status.in_(LIVE))
                .values(lease_until=lease, status="in_progress")
                .returning(StoredResponse.id)
            )
            return renewed.first() is not None

    async def finish(
        self, tenant_id: uuid.UUID, response: ResponseObject, events: Sequence[bytes] = (),
        first: int = 0,
    ) -> bool:  # fmt: skip
        """Replace a live response by its end (completed, incomplete, failed), and keep a
        streamed one's last ``events`` (numbered from ``first``: those ``progress`` did not
        store); False, and only the events written, if it is live no more (cancelled
        meanwhile; deleted: nothing)."""
        async with tenant_transaction(self._sessions, tenant_id) as session:
            row = await session.get(StoredResponse, response.id, with_for_update=True)
            if row is None:
                return False
            await response_events.append(
                session, self._seal, tenant_id, row.id, first=first, events=events
            )
            if row.status not in LIVE:
                return False
            row.sealed = self._sealed(tenant_id, row.id, response, self._opened(row).history)
            row.status, row.lease_until = response.status, None
            return True

    async def cancel(self, tenant_id: uuid.UUID, response_id: str) -> dict[str, Any]:
        """``POST /v1/responses/{id}/cancel``: a live background response ends ``cancelled``
        (one that ended already is answered as it is); 400 for one not run in background."""
        async with tenant_transaction(self._sessions, tenant_id) as session:
            row = await _row(session, tenant_id, response_id, "response_id")
            await session.refresh(row, with_for_update=True)
            kept = self._opened(row)
            if not kept.body.get("background"):
                raise BadRequest(
                    "Only a response created with 'background' set can be cancelled.",
                    param="response_id",
                )  # fmt: skip
            if kept.body["status"] not in LIVE:
                return kept.body
            body = kept.body | {"status": "cancelled"}
            row.sealed = self._sealed(tenant_id, row.id, body, kept.history)
            row.status, row.lease_until = "cancelled", None
            return body

    async def progress(
        self, tenant_id: uuid.UUID, response_id: str, first: int, events: list[bytes]
    ) -> None:
        """Store the events a streamed background response made since number ``first``, while
        it is live, for its readers on other gateways (``finish`` stores the rest)."""
        async with tenant_transaction(self._sessions, tenant_id) as session:
            row = await session.get(StoredResponse, response_id, with_for_update=True)
            if row is not None and row.status in LIVE:
                await response_events.append(
                    session, self._seal, tenant_id, response_id, first=first, events=events
                )

    async def events(
        self, tenant_id: uuid.UUID, response_id: str, start: int = 0
    ) -> tuple[int, list[bytes], bool]:
        """A streamed background response's stored events (all once it ended) from the run
        that holds number ``start`` (or the last run), the number of the first of them, and
        whether it still runs; a 400 naming ``stream`` for any other response."""
        async with tenant_transaction(self._sessions, tenant_id) as session:
            row = await _row(session, tenant_id, response_id, "response_id")
            if row.events is None:
                raise BadRequest(
                    "Only a response created with 'background' and 'stream' can be streamed: "
                    "GET it without 'stream'.", param="stream",
                )  # fmt: skip
            if row.events:  # stored whole, before migration 0036
                return 0, split(self._seal.open(row.events, _events_data(row))), _running(row)
            first, made = await response_events.read(
                session, self._seal, tenant_id, response_id, start
            )
        return first, made, _running(row)

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
        return page(items, after, limit, f"'{response_id}'")

    async def entries(
        self, tenant_id: uuid.UUID, *, after: str | None, limit: int, model: str | None = None,
        metadata: dict[str, str] | None = None,
    ) -> list[Kept]:  # fmt: skip
        """Up to ``limit + 1`` stored responses (one more: there are more), newest first, older
        than the ``after`` one, of ``model`` and carrying every ``metadata`` pair if given: one
        range of ``ix_responses_tenant_created``, read ``SCAN`` rows at a time until it has
        enough (the bodies are sealed: a filter reads them; the console's Logs page, as
        OpenAI's API lists no responses)."""
        key = tuple_(StoredResponse.created_at, StoredResponse.id)
        query = select(StoredResponse).where(
            StoredResponse.tenant_id == tenant_id, StoredResponse.expires_at > datetime.now(UTC)
        )
        wanted, found = (metadata or {}).items(), []
        async with tenant_transaction(self._sessions, tenant_id) as session:
            if after is not None:
                start = await _row(session, tenant_id, after, "after")
                query = query.where(key < tuple_(start.created_at, start.id))
            newest = (StoredResponse.created_at.desc(), StoredResponse.id.desc())
            query = query.order_by(*newest).execution_options(yield_per=SCAN)
            rows = await session.stream_scalars(query)
            async for row in rows:
                kept = self._opened(row)
                body = kept.body
                if (
                    model in (None, body.get("model"))
                    and wanted <= (body.get("metadata") or {}).items()
                ):
                    found.append(kept)
                if len(found) > limit:
                    break
            await rows.close()
        return found

    async def kept(self, tenant_id: uuid.UUID, response_id: str) -> Kept:
        """A stored response and its input items (a 404 naming ``response_id``)."""
        return await self._open(tenant_id, response_id, "response_id")

    async def remove(self, tenant_id: uuid.UUID, response_id: str) -> dict[str, Any]:
        """Delete a stored response (``DELETE /v1/responses/{id}``)."""
        async with tenant_transaction(self._sessions, tenant_id) as session:
            await session.delete(await _row(session, tenant_id, response_id, "response_id"))
        return {"id": response_id, "object": "response", "deleted": True}
