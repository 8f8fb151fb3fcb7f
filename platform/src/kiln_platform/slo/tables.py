"""SLO tables: objectives, their event counts per time bucket, alerts and their notifications."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from kiln_platform.db.tables import Base


def _now() -> Mapped[datetime]:
    return mapped_column(DateTime(timezone=True), server_default=func.now())


class Slo(Base):
    """A service level objective of a model (or of a model for one tenant plan)."""

    __tablename__ = "slos"
    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    model: Mapped[str] = mapped_column(String(200))
    plan: Mapped[str | None] = mapped_column(String(32))
    availability: Mapped[float | None]
    """Fraction of requests that must not be server errors."""
    latency: Mapped[float | None]
    """Fraction of requests that must be faster than ``latency_ms``."""
    latency_ms: Mapped[float]
    period_s: Mapped[float]
    created_at: Mapped[datetime] = _now()


class SloCount(Base):
    """Events judged against one SLO in one time bucket, summed over every gateway."""

    __tablename__ = "slo_counts"
    slo_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("slos.id", ondelete="CASCADE"), primary_key=True
    )
    bucket: Mapped[datetime] = mapped_column(DateTime(timezone=True), primary_key=True)
    total: Mapped[int] = mapped_column(BigInteger)
    errors: Mapped[int] = mapped_column(BigInteger)
    slow: Mapped[int] = mapped_column(BigInteger)


class Alert(Base):
    """One alert's life: firing from ``starts_at``, resolved at ``ends_at``."""

    __tablename__ = "alerts"
    __table_args__ = (
        Index(
            "uq_alerts_firing_fingerprint", "fingerprint", unique=True,
            postgresql_where=text("status = 'firing'"),
        ),
    )  # fmt: skip
    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    fingerprint: Mapped[str] = mapped_column(String(64))
    """Stable per alert rule and SLO (Alertmanager's ``fingerprint``)."""
    name: Mapped[str] = mapped_column(String(100))
    status: Mapped[str] = mapped_column(String(16))
    labels: Mapped[dict[str, Any]] = mapped_column(JSONB)
    annotations: Mapped[dict[str, Any]] = mapped_column(JSONB)
    starts_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    ends_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class AlertNotification(Base):
    """One state change of an alert, to be delivered once to the receivers (by its id)."""

    __tablename__ = "alert_notifications"
    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    alert_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("alerts.id", ondelete="CASCADE"))
    payload: Mapped[dict[str, Any]] = mapped_column(JSONB)
    attempts: Mapped[int] = mapped_column(Integer, server_default="0")
    next_attempt_at: Mapped[datetime] = _now()
    delivered_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = _now()


class AlertReceiver(Base):
    """A webhook every notification is delivered to (besides ``KILN_ALERT_WEBHOOK_URL``)."""

    __tablename__ = "alert_receivers"
    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    url: Mapped[str] = mapped_column(Text)
    secret_sealed: Mapped[bytes] = mapped_column(LargeBinary)
    """The signing key, sealed (``kiln_platform.sealing``, the receiver's id as identity)."""
    created_at: Mapped[datetime] = _now()


class AlertDelivery(Base):
    """One notification's delivery to one stored receiver (made when the notification is)."""

    __tablename__ = "alert_deliveries"
    notification_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("alert_notifications.id", ondelete="CASCADE"), primary_key=True
    )
    receiver_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("alert_receivers.id", ondelete="CASCADE"), primary_key=True
    )
    attempts: Mapped[int] = mapped_column(Integer, server_default="0")
    next_attempt_at: Mapped[datetime] = _now()
    delivered_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_error: Mapped[str | None] = mapped_column(Text)
