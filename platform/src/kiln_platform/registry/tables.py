"""Rollout tables: a canary's rollout per model (plan, step, history) and its per-step counts."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, DateTime, ForeignKey, Index, SmallInteger, String, func, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from kiln_platform.db.tables import Base


class ModelRollout(Base):
    """A canary version rolled out step by step against a model's stable version."""

    __tablename__ = "model_rollouts"
    __table_args__ = (
        Index("uq_model_rollouts_running", "model_id", unique=True,
              postgresql_where=text("state = 'running'")),
    )  # fmt: skip
    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    model_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"))
    stable_version: Mapped[str] = mapped_column(String(64))
    canary_version: Mapped[str] = mapped_column(String(64))
    plan: Mapped[dict[str, Any]] = mapped_column(JSONB)
    state: Mapped[str] = mapped_column(String(16), server_default="running")
    step: Mapped[int] = mapped_column(SmallInteger, server_default="0")
    """Index into the plan's steps."""
    step_started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    history: Mapped[list[dict[str, Any]]] = mapped_column(JSONB, server_default="[]")
    created_by: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class RolloutCount(Base):
    """One gateway's counts of one arm in one step (overwritten by that gateway each tick)."""

    __tablename__ = "rollout_counts"
    rollout_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("model_rollouts.id", ondelete="CASCADE"), primary_key=True
    )
    step: Mapped[int] = mapped_column(SmallInteger, primary_key=True)
    gateway: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    arm: Mapped[str] = mapped_column(String(8), primary_key=True)
    total: Mapped[int] = mapped_column(BigInteger)
    errors: Mapped[int] = mapped_column(BigInteger)
    degenerate: Mapped[int] = mapped_column(BigInteger)
    latency: Mapped[list[int]] = mapped_column(JSONB)
    """Histogram (``rollout_policy.BUCKETS``)."""
