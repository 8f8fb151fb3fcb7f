"""Shadow traffic tables (``0018``): catalog data, not tenant data (no tenant column, no RLS)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import CheckConstraint, DateTime, ForeignKey, SmallInteger, String, func
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from kiln_platform.db.tables import Base


class ModelShadow(Base):
    """A model's shadow candidate: the version that gets a copy of ``percent`` of its requests."""

    __tablename__ = "model_shadows"
    __table_args__ = (CheckConstraint("percent BETWEEN 0 AND 100", name="percent_range"),)
    model_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("models.id", ondelete="CASCADE"), primary_key=True
    )
    version: Mapped[str] = mapped_column(String(64))
    percent: Mapped[int] = mapped_column(SmallInteger)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class ShadowReport(Base):
    """One gateway's comparison of a model's answers with a candidate's (written every few s)."""

    __tablename__ = "shadow_reports"
    model_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("models.id", ondelete="CASCADE"), primary_key=True
    )
    candidate: Mapped[str] = mapped_column(String(64), primary_key=True)
    gateway: Mapped[str] = mapped_column(String(200), primary_key=True)
    report: Mapped[dict[str, Any]] = mapped_column(JSONB)
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now(), onupdate=func.now()
    )
