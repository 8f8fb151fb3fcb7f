"""Secrets and signatures per the Standard Webhooks spec: ``whsec_<base64>`` secrets, sealed at
rest, and the ``webhook-id`` / ``webhook-timestamp`` / ``webhook-signature`` headers (one ``v1``
signature per secret in force: the new one and, for a grace period, the rotated one)."""

from __future__ import annotations

import base64
import secrets
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from standardwebhooks import Webhook

from kiln_platform.sealing import Seal

if TYPE_CHECKING:
    import uuid

    from kiln_platform.webhooks.tables import WebhookEndpoint

PURPOSE = b"kiln/webhook-secret"
PREFIX = "whsec_"


def webhook_seal(secret: bytes) -> Seal:
    """The seal of endpoints' signing secrets under the server secret."""
    return Seal(secret, PURPOSE)


def new_secret() -> str:
    """A fresh ``whsec_`` secret (24 random bytes, base64)."""
    return PREFIX + base64.b64encode(secrets.token_bytes(24)).decode()


def identity(endpoint_id: uuid.UUID, previous: bool = False) -> bytes:
    """The sealed value's identity: its endpoint, and which of its two secrets it is."""
    return endpoint_id.bytes + (b"/previous" if previous else b"/current")


def seal_secret(seal: Seal, endpoint_id: uuid.UUID, secret: str, previous: bool = False) -> bytes:
    """``secret`` sealed to its endpoint and slot."""
    return seal.seal(secret.encode(), identity(endpoint_id, previous))


def secrets_in_force(row: WebhookEndpoint, seal: Seal, now: datetime) -> list[str]:
    """The endpoint's current secret, and the rotated one while its grace period lasts."""
    found = [seal.open(row.secret_sealed, identity(row.id)).decode()]
    if row.previous_sealed and row.previous_until and row.previous_until > now:
        found.append(seal.open(row.previous_sealed, identity(row.id, previous=True)).decode())
    return found


def message_id(delivery_id: uuid.UUID) -> str:
    """The ``webhook-id`` of a delivery: one per event and endpoint, the same on every retry."""
    return f"msg_{delivery_id.hex}"


def headers(
    msg_id: str, body: bytes, keys: list[str], at: datetime | None = None
) -> dict[str, str]:
    """The spec's three headers for ``body``, signed with every key in ``keys``."""
    when = (at or datetime.now(UTC)).replace(microsecond=0)
    text = body.decode()
    signature = " ".join(Webhook(key).sign(msg_id, when, text) for key in keys)
    return {
        "content-type": "application/json",
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(when.timestamp())),
        "webhook-signature": signature,
    }
