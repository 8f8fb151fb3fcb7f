"""Alert receivers as data (platform-admin, audited): webhooks each notification fans out to,
their signing keys sealed at rest like the OAuth signing keys (``kiln_platform.sealing``)."""

from __future__ import annotations

import secrets
import uuid
from typing import TYPE_CHECKING

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from kiln_platform.admin.authz import Actor, require
from kiln_platform.audit.services import record, snapshot
from kiln_platform.errors import Conflict, NotFound
from kiln_platform.sealing import Seal
from kiln_platform.slo.schemas import ReceiverCreate, ReceiverCreated, ReceiverView
from kiln_platform.slo.tables import AlertReceiver

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

PURPOSE = b"kiln/alert-receiver-key"
RESOURCE = "alert-receivers"


def receiver_seal(secret: bytes) -> Seal:
    """The seal of receivers' signing keys under the server secret."""
    return Seal(secret, PURPOSE)


def signing_key(row: AlertReceiver, seal: Seal) -> bytes:
    """A receiver's signing key, unsealed."""
    return seal.open(row.secret_sealed, row.id.bytes)


def _view(row: AlertReceiver) -> ReceiverView:
    return ReceiverView(row.id, row.name, row.url, row.created_at)


async def create_receiver(
    session: AsyncSession, actor: Actor, data: ReceiverCreate, seal: Seal
) -> ReceiverCreated:
    """Store a receiver; notifications made from now on are delivered to it."""
    require(actor, RESOURCE, write=True)
    key = data.secret or secrets.token_urlsafe(32)
    rid = uuid.uuid4()
    row = AlertReceiver(id=rid, name=data.name, url=data.url,
                        secret_sealed=seal.seal(key.encode(), rid.bytes))  # fmt: skip
    session.add(row)
    try:
        await session.flush()
    except IntegrityError:
        raise Conflict(f"A receiver named '{data.name}' already exists.") from None
    await session.refresh(row)
    after = snapshot(row, "name", "url")
    await record(session, actor, "alert-receiver.create", "alert-receiver", rid, None, after=after)
    return ReceiverCreated(_view(row), key)


async def list_receivers(session: AsyncSession, actor: Actor) -> list[ReceiverView]:
    """Every stored receiver, by name (never a key)."""
    require(actor, RESOURCE)
    return [_view(r) for r in await session.scalars(select(AlertReceiver).order_by("name"))]


async def delete_receiver(session: AsyncSession, actor: Actor, receiver_id: uuid.UUID) -> None:
    """Delete a receiver and its pending deliveries."""
    require(actor, RESOURCE, write=True)
    row = await session.get(AlertReceiver, receiver_id)
    if row is None:
        raise NotFound("No such receiver.")
    before = snapshot(row, "name", "url")
    await session.delete(row)
    await record(session, actor, "alert-receiver.delete", "alert-receiver", row.id, None,
                 before=before)  # fmt: skip
