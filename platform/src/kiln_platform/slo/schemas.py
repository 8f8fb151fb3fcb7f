"""SLO and alert wire types."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any

import msgspec

Fraction = Annotated[float, msgspec.Meta(gt=0, lt=1)]
Name = Annotated[str, msgspec.Meta(min_length=1, max_length=100, pattern=r"^[a-z0-9][a-z0-9-]*$")]


class SloCreate(msgspec.Struct, forbid_unknown_fields=True):
    """A new SLO: at least one of the two objectives."""

    name: Name
    model: Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
    plan: Annotated[str, msgspec.Meta(max_length=32)] | None = None
    """Only requests of tenants on this plan (null: every request to the model)."""
    availability: Fraction | None = None
    """e.g. 0.999: 99.9% of requests are not server errors."""
    latency: Fraction | None = None
    """e.g. 0.99: 99% of requests under ``latency_ms`` (time to first token for generation)."""
    latency_ms: Annotated[float, msgspec.Meta(gt=0)] = 1000.0
    period_days: Annotated[float, msgspec.Meta(gt=0, le=366)] = 30.0


class SloView(msgspec.Struct):
    """An SLO as stored."""

    id: uuid.UUID
    name: str
    model: str
    plan: str | None
    availability: float | None
    latency: float | None
    latency_ms: float
    period_days: float
    created_at: datetime


class SliStatus(msgspec.Struct):
    """One SLI over the SLO's period: its events, the budget left, the burn in each window."""

    sli: str
    objective: float
    total: int
    bad: int
    budget_remaining: float
    """1: untouched; 0: spent; negative: overspent."""
    burn_rates: dict[str, float]
    """Window (seconds) -> burn rate in it."""


class SloStatus(msgspec.Struct):
    """An SLO and how it stands now."""

    slo: SloView
    slis: list[SliStatus]
    firing: list[str]
    """Names of its alerts firing now."""


class AlertView(msgspec.Struct):
    """One alert: firing from ``starts_at`` until ``ends_at``."""

    id: uuid.UUID
    name: str
    status: str
    fingerprint: str
    labels: dict[str, Any]
    annotations: dict[str, Any]
    starts_at: datetime
    ends_at: datetime | None


class ReceiverCreate(msgspec.Struct, forbid_unknown_fields=True):
    """A webhook to deliver every alert notification to, signed with its own key."""

    name: Name
    url: Annotated[str, msgspec.Meta(max_length=2000, pattern=r"^https?://[^\s]+$")]
    secret: Annotated[str, msgspec.Meta(min_length=16, max_length=200)] | None = None
    """The signing key the receiver verifies with (default: a new random one, shown once)."""


class ReceiverView(msgspec.Struct):
    """A receiver as listed: never its key."""

    id: uuid.UUID
    name: str
    url: str
    created_at: datetime


class ReceiverCreated(msgspec.Struct):
    """A created receiver: ``secret`` is shown here once (stored sealed)."""

    receiver: ReceiverView
    secret: str
