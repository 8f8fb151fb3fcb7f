"""The outbox: an event becomes one delivery row per subscribed endpoint of its tenant, written
in the transaction that makes the event (so none is lost, and none is sent for a change that
rolled back). The payload is the spec's ``{"type", "timestamp", "data"}``."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal, get_args

import msgspec
from sqlalchemy import text

if TYPE_CHECKING:
    import uuid

    from sqlalchemy.ext.asyncio import AsyncSession

EventType = Literal[
    "batch.completed", "batch.failed", "batch.expired", "batch.cancelled",
    "budget.threshold_reached",
]  # fmt: skip
EVENT_TYPES: tuple[str, ...] = get_args(EventType)

FAN_OUT = """
INSERT INTO webhook_deliveries (id, tenant_id, endpoint_id, event_type, payload)
SELECT gen_random_uuid(), e.tenant_id, e.id, '{type}', jsonb_build_object(
    'type', '{type}',
    'timestamp', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
    'data', event.data)
FROM event JOIN webhook_endpoints e
  ON e.tenant_id = event.tenant_id AND e.enabled AND '{type}' = ANY(e.events)
"""
"""Deliveries of the rows of a CTE named ``event`` (``tenant_id``, ``data`` jsonb): the
statement that makes the event's rows prefixes it (``WITH event AS (... RETURNING ...)``)."""


def fan_out(event_type: EventType) -> str:
    """``FAN_OUT`` for one event type (a constant of this module, never input)."""
    if event_type not in EVENT_TYPES:
        raise ValueError(event_type)
    return FAN_OUT.format(type=event_type)


async def emit(
    session: AsyncSession, tenant_id: uuid.UUID, event_type: EventType, data: dict[str, Any]
) -> None:
    """Queue ``event_type`` with ``data`` for the tenant's endpoints subscribed to it, in the
    caller's transaction."""
    event = "WITH event AS (SELECT CAST(:t AS uuid) AS tenant_id, CAST(:d AS jsonb) AS data)"
    params = {"t": tenant_id, "d": msgspec.json.encode(data).decode()}
    await session.execute(text(event + fan_out(event_type)), params)


def iso(at: datetime | None) -> str | None:
    """An RFC 3339 UTC time for a payload."""
    return None if at is None else at.astimezone(UTC).isoformat().replace("+00:00", "Z")
