"""Alert notifications: the Alertmanager-compatible payload, its signature, its delivery.

Each notification is POSTed as Alertmanager's webhook JSON (``version`` "4", ``status``,
``alerts[]`` with ``labels``, ``annotations``, ``startsAt``, ``endsAt``, ``fingerprint``) plus
``notificationId``; a retried delivery carries the same id, so a receiver drops replays by it.
``x-kiln-signature: t=<unix seconds>,v1=<hex HMAC-SHA256(key, "<t>." + body)>`` signs the body.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import time
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import aiohttp
import msgspec
import structlog
from sqlalchemy import Uuid, insert, literal, select

from kiln_platform.slo.tables import Alert, AlertDelivery, AlertNotification, AlertReceiver
from kiln_platform.webhooks import transport

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

SIGNATURE_HEADER = "x-kiln-signature"
ID_HEADER = "x-kiln-notification-id"
MAX_ATTEMPTS = 10
TOLERANCE_S = 300.0
log = structlog.get_logger("kiln.alerts")


def _iso(at: datetime | None) -> str:
    return (at or datetime(1, 1, 1, tzinfo=UTC)).isoformat().replace("+00:00", "Z")


def payload(alert: Alert, notification_id: str) -> dict[str, Any]:
    """Alertmanager's webhook body for one alert in its current state."""
    item = {
        "status": alert.status,
        "labels": alert.labels,
        "annotations": alert.annotations,
        "startsAt": _iso(alert.starts_at),
        "endsAt": _iso(alert.ends_at),
        "generatorURL": "",
        "fingerprint": alert.fingerprint,
    }
    return {
        "version": "4",
        "notificationId": notification_id,
        "groupKey": f"{{}}:{{alertname={alert.labels['alertname']!r}}}",
        "status": alert.status,
        "receiver": "kiln-webhook",
        "groupLabels": {"alertname": alert.labels["alertname"]},
        "commonLabels": alert.labels,
        "commonAnnotations": alert.annotations,
        "externalURL": "",
        "truncatedAlerts": 0,
        "alerts": [item],
    }


async def enqueue(session: AsyncSession, alert: Alert) -> None:
    """Store the alert's current state and a notification of it (its payload names its id),
    with a delivery to each stored receiver."""
    await session.flush()
    note = AlertNotification(alert_id=alert.id, payload={})
    session.add(note)
    await session.flush()
    note.payload = payload(alert, str(note.id))
    receivers = select(literal(note.id, Uuid), AlertReceiver.id)
    await session.execute(
        insert(AlertDelivery).from_select(["notification_id", "receiver_id"], receivers)
    )


def sign(key: bytes, body: bytes, at: int) -> str:
    """The signature header's value for ``body`` sent at unix time ``at``."""
    mac = hmac.new(key, f"{at}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={at},v1={mac}"


def verify(key: bytes, body: bytes, header: str, now: float | None = None) -> bool:
    """What a receiver does: the signature matches and is no older than five minutes."""
    parts = dict(part.split("=", 1) for part in header.split(",") if "=" in part)
    try:
        at = int(parts["t"])
    except (KeyError, ValueError):
        return False
    fresh = abs((time.time() if now is None else now) - at) <= TOLERANCE_S
    return fresh and hmac.compare_digest(sign(key, body, at), header)


async def deliver_due(
    session: AsyncSession, http: aiohttp.ClientSession, url: str, key: bytes, retry_s: float
) -> int:
    """POST every notification that is due, at once (locked: one gateway sends each); reschedule
    failed ones with exponential backoff. Returns how many were delivered."""
    now = datetime.now(UTC)
    due = await session.scalars(
        select(AlertNotification)
        .where(
            AlertNotification.delivered_at.is_(None),
            AlertNotification.next_attempt_at <= now,
            AlertNotification.attempts < MAX_ATTEMPTS,
        )
        .order_by(AlertNotification.created_at)
        .limit(50)
        .with_for_update(skip_locked=True)
    )
    notes = list(due)
    bodies = [msgspec.json.encode(note.payload) for note in notes]
    errors = await asyncio.gather(*(
        post(http, url, body, sign(key, body, int(time.time())), str(note.id))
        for note, body in zip(notes, bodies, strict=True)
    ))  # fmt: skip
    for note, error in zip(notes, errors, strict=True):
        note.attempts += 1
        if error is None:
            note.delivered_at = datetime.now(UTC)
        else:
            note.last_error = error
            note.next_attempt_at = retry_at(now, retry_s, note.attempts)
            log.warning("alert delivery failed", notification=str(note.id), error=error)
    return errors.count(None)


def retry_at(now: datetime, retry_s: float, attempts: int) -> datetime:
    """When a delivery that failed ``attempts`` times is tried again (exponential backoff)."""
    return now + timedelta(seconds=retry_s * 2 ** (attempts - 1))


async def post(
    http: aiohttp.ClientSession, url: str, body: bytes, signature: str, note_id: str
) -> str | None:
    """One delivery attempt (``webhooks.transport``: no redirect followed): None on a 2xx,
    else what went wrong."""
    headers = {"content-type": "application/json", SIGNATURE_HEADER: signature, ID_HEADER: note_id}
    return (await transport.post(http, url, body, headers, timeout_s=10.0)).error
