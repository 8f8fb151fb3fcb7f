"""Webhook endpoints, their deliveries (the outbox) and each delivery's attempts (tenant tables:
row-level security, migration 0022)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Identity,
    Integer,
    LargeBinary,
    SmallInteger,
    String,
    Text,
    func,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.orm import Mapped, mapped_column

from kiln_platform.db.tables import Base


def _now() -> Mapped[datetime]:
    return mapped_column(DateTime(timezone=True), server_default=func.now())


def _tenant() -> Mapped[uuid.UUID]:
    return mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))


class WebhookEndpoint(Base):
    """Where a tenant wants its events POSTed, and the secret(s) they are signed with."""

    __tablename__ = "webhook_endpoints"
    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    tenant_id: Mapped[uuid.UUID] = _tenant()
    url: Mapped[str] = mapped_column(Text)
    description: Mapped[str] = mapped_column(String(200), server_default="")
    events: Mapped[list[str]] = mapped_column(ARRAY(String(64)))
    enabled: Mapped[bool] = mapped_column(Boolean, server_default="true")
    secret_sealed: Mapped[bytes] = mapped_column(LargeBinary)
    """The ``whsec_`` secret, sealed (``kiln_platform.sealing``, the endpoint's id as identity)."""
    previous_sealed: Mapped[bytes | None] = mapped_column(LargeBinary)
    """The secret before the last rotation, still signed with until ``previous_until``."""
    previous_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = _now()


class WebhookDelivery(Base):
    """One event for one endpoint: written in the transaction that made the event (the outbox),
    then sent until delivered or its retry window closes. Its id is the ``webhook-id``."""

    __tablename__ = "webhook_deliveries"
    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    tenant_id: Mapped[uuid.UUID] = _tenant()
    endpoint_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("webhook_endpoints.id", ondelete="CASCADE")
    )
    event_type: Mapped[str] = mapped_column(String(64))
    payload: Mapped[dict[str, Any]] = mapped_column(JSONB)
    state: Mapped[str] = mapped_column(String(16), server_default="pending")
    """``pending``, ``delivered`` or ``failed`` (its retry window closed)."""
    attempts: Mapped[int] = mapped_column(Integer, server_default="0")
    last_code: Mapped[int | None] = mapped_column(SmallInteger)
    next_attempt_at: Mapped[datetime] = _now()
    window_from: Mapped[datetime] = _now()
    """Start of the retry window (creation, or a manual redelivery)."""
    created_at: Mapped[datetime] = _now()
    delivered_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class WebhookAttempt(Base):
    """One POST of a delivery: its outcome, response code, duration and error."""

    __tablename__ = "webhook_attempts"
    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    tenant_id: Mapped[uuid.UUID] = _tenant()
    delivery_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("webhook_deliveries.id", ondelete="CASCADE")
    )
    outcome: Mapped[str] = mapped_column(String(16))
    """``delivered``, ``error`` (a non-2xx answer or no answer) or ``refused`` (the SSRF guard)."""
    response_code: Mapped[int | None] = mapped_column(SmallInteger)
    duration_ms: Mapped[float] = mapped_column(Float)
    error: Mapped[str | None] = mapped_column(Text)
    at: Mapped[datetime] = _now()
