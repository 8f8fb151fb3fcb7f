"""Files, batches and batch lines (tenant tables: row-level security, migration 0019)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, Boolean, DateTime, ForeignKey, Integer, String, Text, func
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from kiln_platform.db.tables import Base


def _ts(**kw: Any) -> Mapped[datetime | None]:
    return mapped_column(DateTime(timezone=True), **kw)


def _tenant() -> Mapped[uuid.UUID]:
    return mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))


class StoredFile(Base):
    """A tenant's file: its bytes are a blob in the artifact store, named by ``digest``."""

    __tablename__ = "files"
    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    tenant_id: Mapped[uuid.UUID] = _tenant()
    filename: Mapped[str] = mapped_column(String(255))
    purpose: Mapped[str] = mapped_column(String(32))
    bytes: Mapped[int] = mapped_column(BigInteger)
    lines: Mapped[int] = mapped_column(Integer)
    digest: Mapped[str] = mapped_column(String(64))
    """The blob's hex sha256."""
    estimated_tokens: Mapped[int] = mapped_column(BigInteger, server_default="0")
    """Its lines' estimated tokens (``quotas.batch_policy.line_tokens``): the batch quotas'."""
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    expires_at: Mapped[datetime | None] = _ts()
    """When it is deleted (``expires_after``, else ``KILN_BATCH_FILE_TTL_S``; migration 0034);
    null: kept until deleted."""


class BatchJob(Base):
    """A batch: its input file, endpoint, status and the timestamps of the status machine."""

    __tablename__ = "batches"
    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    tenant_id: Mapped[uuid.UUID] = _tenant()
    endpoint: Mapped[str] = mapped_column(String(64))
    input_file_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("files.id", ondelete="SET NULL")
    )
    completion_window: Mapped[str] = mapped_column(String(8))
    status: Mapped[str] = mapped_column(String(16))
    metadata_: Mapped[dict[str, str] | None] = mapped_column("metadata", JSONB)
    principal: Mapped[dict[str, Any]] = mapped_column(JSONB)
    """Who the lines run as (the creating key, its tenant's plan and weight)."""
    errors: Mapped[list[dict[str, Any]] | None] = mapped_column(JSONB)
    output_file_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("files.id", ondelete="SET NULL")
    )
    error_file_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("files.id", ondelete="SET NULL")
    )
    total: Mapped[int] = mapped_column(Integer, server_default="0")
    estimated_tokens: Mapped[int] = mapped_column(BigInteger, server_default="0")
    """Its input file's estimated tokens: counted under ``batch_enqueued_tokens`` while open."""
    output_expires_s: Mapped[int | None] = mapped_column(Integer)
    """``output_expires_after.seconds``: its output and error files expire so long after they
    are made (null: kept until deleted)."""
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    in_progress_at: Mapped[datetime | None] = _ts()
    finalizing_at: Mapped[datetime | None] = _ts()
    completed_at: Mapped[datetime | None] = _ts()
    failed_at: Mapped[datetime | None] = _ts()
    expired_at: Mapped[datetime | None] = _ts()
    cancelling_at: Mapped[datetime | None] = _ts()
    cancelled_at: Mapped[datetime | None] = _ts()
    lease_owner: Mapped[str | None] = mapped_column(String(64))
    """The gateway running the batch (``lease_until``: until when, unless it renews)."""
    lease_until: Mapped[datetime | None] = _ts()


class BatchLine(Base):
    """One finished line of a batch: its output (or error) line, written with its ledger row."""

    __tablename__ = "batch_lines"
    batch_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("batches.id", ondelete="CASCADE"), primary_key=True
    )
    custom_id: Mapped[str] = mapped_column(String(512), primary_key=True)
    tenant_id: Mapped[uuid.UUID] = _tenant()
    line: Mapped[int] = mapped_column(Integer)
    ok: Mapped[bool] = mapped_column(Boolean)
    output: Mapped[str] = mapped_column(Text)
    """The JSON line of the output file (``ok``) or of the error file."""
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
