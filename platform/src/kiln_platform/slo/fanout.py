"""Deliveries to the stored receivers (``/admin/v1/alert-receivers``): each notification is
POSTed to every receiver that existed when it was made, signed with that receiver's own key,
and retried per receiver exactly as ``notify.deliver_due`` retries the settings' receiver."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import msgspec
import structlog
from sqlalchemy import select

from kiln_platform.slo import notify
from kiln_platform.slo.receivers import signing_key
from kiln_platform.slo.tables import AlertDelivery, AlertNotification, AlertReceiver

if TYPE_CHECKING:
    import aiohttp
    from sqlalchemy.ext.asyncio import AsyncSession

    from kiln_platform.sealing import Seal

log = structlog.get_logger("kiln.alerts")


async def deliver_due(
    session: AsyncSession, http: aiohttp.ClientSession, seal: Seal, retry_s: float
) -> int:
    """POST every delivery that is due, at once (rows locked: one gateway sends each); reschedule
    failed ones with exponential backoff. Returns how many were delivered."""
    now = datetime.now(UTC)
    rows = (
        await session.execute(
            select(AlertDelivery, AlertNotification, AlertReceiver)
            .join(AlertNotification, AlertNotification.id == AlertDelivery.notification_id)
            .join(AlertReceiver, AlertReceiver.id == AlertDelivery.receiver_id)
            .where(
                AlertDelivery.delivered_at.is_(None),
                AlertDelivery.next_attempt_at <= now,
                AlertDelivery.attempts < notify.MAX_ATTEMPTS,
            )
            .order_by(AlertNotification.created_at)
            .limit(50)
            .with_for_update(of=AlertDelivery, skip_locked=True)
        )
    ).all()
    errors = await asyncio.gather(*(_send(http, seal, note, to) for _, note, to in rows))
    for (delivery, note, to), error in zip(rows, errors, strict=True):
        delivery.attempts += 1
        if error is None:
            delivery.delivered_at = datetime.now(UTC)
        else:
            delivery.last_error = error
            delivery.next_attempt_at = notify.retry_at(now, retry_s, delivery.attempts)
            log.warning("alert delivery failed", notification=str(note.id), receiver=to.name,
                        error=error)  # fmt: skip
    return errors.count(None)


async def _send(
    http: aiohttp.ClientSession, seal: Seal, note: AlertNotification, to: AlertReceiver
) -> str | None:
    body = msgspec.json.encode({**note.payload, "receiver": to.name})
    signature = notify.sign(signing_key(to, seal), body, int(time.time()))
    return await notify.post(http, to.url, body, signature, str(note.id))
