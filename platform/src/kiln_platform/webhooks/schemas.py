"""Webhook wire types: endpoints (never their secrets, but once), deliveries and attempts."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any

import msgspec

from kiln_platform.webhooks.events import EventType

Url = Annotated[str, msgspec.Meta(max_length=2000, pattern=r"^https?://[^\s]+$")]
Events = Annotated[list[EventType], msgspec.Meta(min_length=1, max_length=16)]
Description = Annotated[str, msgspec.Meta(max_length=200)]


class EndpointCreate(msgspec.Struct, forbid_unknown_fields=True):
    """A URL to POST the tenant's events of the listed types to."""

    url: Url
    events: Events
    description: Description = ""


class EndpointUpdate(msgspec.Struct, forbid_unknown_fields=True):
    """Fields to change (absent: unchanged)."""

    url: Url | None = None
    events: Events | None = None
    description: Description | None = None
    enabled: bool | None = None


class EndpointView(msgspec.Struct):
    """An endpoint as listed: never its secret."""

    id: uuid.UUID
    tenant_id: uuid.UUID
    url: str
    events: list[str]
    description: str
    enabled: bool
    created_at: datetime
    previous_secret_until: datetime | None
    """While set and in the future, deliveries are signed with the rotated secret too."""


class EndpointSecret(msgspec.Struct):
    """A created endpoint or a rotated secret: ``secret`` (``whsec_...``) is shown here once."""

    endpoint: EndpointView
    secret: str


class AttemptView(msgspec.Struct):
    """One POST of a delivery."""

    at: datetime
    outcome: str
    response_code: int | None
    duration_ms: float
    error: str | None


class DeliveryView(msgspec.Struct):
    """One event for one endpoint: its ``webhook-id``, state and attempts (oldest first)."""

    id: uuid.UUID
    webhook_id: str
    event_type: str
    state: str
    attempts: int
    last_code: int | None
    created_at: datetime
    next_attempt_at: datetime | None
    delivered_at: datetime | None
    payload: dict[str, Any]
    log: list[AttemptView]
