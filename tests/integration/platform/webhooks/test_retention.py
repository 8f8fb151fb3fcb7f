"""Webhook deliveries that ended are pruned after ``KILN_WEBHOOK_RETENTION_S``: the sender's
loop deletes delivered and failed rows (and their attempts) past it, in batches, and keeps
pending ones and recent ones. A real PostgreSQL; rows aged by setting their timestamps."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from pydantic import SecretStr
from sqlalchemy import func, select

from kiln_platform.db.database import Database
from kiln_platform.settings import Settings
from kiln_platform.webhooks import retention
from kiln_platform.webhooks.sender import WebhookSender
from kiln_platform.webhooks.tables import WebhookAttempt, WebhookDelivery, WebhookEndpoint
from tests.factories import make_tenant

DAY = timedelta(days=1)


async def _seed(db: Database, rows: list[tuple[str, timedelta]]) -> list[uuid.UUID]:
    """A tenant's endpoint and one delivery (with an attempt) per (state, age) in ``rows``."""
    now = datetime.now(UTC)
    async with db.sessions.begin() as session:
        tenant = await make_tenant(session)
        endpoint = WebhookEndpoint(tenant_id=tenant, url="https://example.com/hook",
                                   events=["batch.completed"], secret_sealed=b"x")  # fmt: skip
        session.add(endpoint)
        await session.flush()
        made = [
            WebhookDelivery(
                tenant_id=tenant, endpoint_id=endpoint.id, event_type="batch.completed",
                payload={}, state=state, created_at=now - age, window_from=now - age,
                delivered_at=now - age if state == "delivered" else None,
                next_attempt_at=now + DAY,  # a pending one is not due: it stays pending
            )
            for state, age in rows
        ]  # fmt: skip
        session.add_all(made)
        await session.flush()
        session.add_all(
            WebhookAttempt(tenant_id=tenant, delivery_id=d.id, outcome="error", duration_ms=1.0)
            for d in made
        )
    return [d.id for d in made]


async def _left(db: Database, ids: list[uuid.UUID]) -> tuple[set[uuid.UUID], int]:
    """Which of ``ids`` are still there, and how many attempts they have."""
    async with db.sessions() as session:
        kept = set(await session.scalars(select(WebhookDelivery.id).where(
            WebhookDelivery.id.in_(ids))))  # fmt: skip
        attempts = await session.scalar(select(func.count()).where(
            WebhookAttempt.delivery_id.in_(ids)))  # fmt: skip
    return kept, int(attempts or 0)


async def test_the_sender_prunes_ended_deliveries_past_retention(
    db: Database, database_uri: str, tmp_path: Path
) -> None:
    ids = await _seed(db, [("delivered", 31 * DAY), ("failed", 31 * DAY),
                           ("delivered", 29 * DAY), ("failed", 29 * DAY),
                           ("pending", 31 * DAY)])  # fmt: skip
    settings = Settings(data_dir=tmp_path, database_url=database_uri, secret_key=SecretStr("r"),
                        webhook_poll_s=0.05)  # fmt: skip
    assert settings.webhook_retention_s == 30 * 86400  # the documented default
    sender = WebhookSender(db.sessions, settings)
    sender.start()  # its loop prunes at once, then every retention.PRUNE_EVERY_S
    try:
        deadline = time.monotonic() + 10
        while (await _left(db, ids))[0] != set(ids[2:]):
            assert time.monotonic() < deadline, "not pruned"
            await asyncio.sleep(0.05)
    finally:
        await sender.stop()
    assert await _left(db, ids) == (set(ids[2:]), 3)  # their attempts went with them


@pytest.mark.parametrize("batch", [2])
async def test_prune_deletes_in_batches_until_none_is_left(db: Database, batch: int) -> None:
    ids = await _seed(db, [("delivered", 3 * DAY)] * 5 + [("delivered", DAY / 2)])
    assert await retention.prune(db.sessions, DAY.total_seconds(), batch=batch) >= 5
    assert await _left(db, ids) == ({ids[-1]}, 1)
