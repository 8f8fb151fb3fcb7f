"""The shared fleet's tables (``0026``): deployment state, not tenant data (no RLS)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import Boolean, DateTime, Integer, String, func
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from kiln_platform.db.tables import Base


class FleetGateway(Base):
    """A gateway of the deployment, alive while its heartbeat is fresh; ``wishes`` is each
    pool's size as its own autoscaling policy last decided (``pool key -> replicas``)."""

    __tablename__ = "fleet_gateways"
    id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    host: Mapped[str] = mapped_column(String(200))
    pid: Mapped[int] = mapped_column(Integer)
    leader: Mapped[bool] = mapped_column(Boolean, server_default="false")
    wishes: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default="{}")
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    heartbeat_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )


class FleetReplica(Base):
    """A ready worker the leader runs, registered for every gateway to dispatch to."""

    __tablename__ = "fleet_replicas"
    url: Mapped[str] = mapped_column(String(300), primary_key=True)
    pool: Mapped[str] = mapped_column(String(300), index=True)
    gateway_id: Mapped[uuid.UUID]
    task: Mapped[str] = mapped_column(String(32))
    slots: Mapped[int] = mapped_column(Integer)
    max_batch_size: Mapped[int] = mapped_column(Integer)
    max_queue: Mapped[int] = mapped_column(Integer)
    heartbeat_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )


class FleetPool(Base):
    """A pool's size as the leader last applied it (what followers read as desired)."""

    __tablename__ = "fleet_pools"
    pool: Mapped[str] = mapped_column(String(300), primary_key=True)
    desired: Mapped[int] = mapped_column(Integer)
    gateway_id: Mapped[uuid.UUID]
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
