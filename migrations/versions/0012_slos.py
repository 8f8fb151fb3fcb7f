"""SLOs as data: objectives, their event counts per bucket, alerts and notifications.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

_TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "slos",
        sa.Column("id", sa.Uuid(), primary_key=True),
        sa.Column("name", sa.String(100), nullable=False, unique=True),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("plan", sa.String(32)),
        sa.Column("availability", sa.Float()),
        sa.Column("latency", sa.Float()),
        sa.Column("latency_ms", sa.Float(), nullable=False),
        sa.Column("period_s", sa.Float(), nullable=False),
        sa.Column("created_at", _TZ, server_default=sa.func.now(), nullable=False),
    )
    op.create_table(
        "slo_counts",
        sa.Column(
            "slo_id", sa.Uuid(), sa.ForeignKey("slos.id", ondelete="CASCADE"), primary_key=True
        ),
        sa.Column("bucket", _TZ, primary_key=True),
        sa.Column("total", sa.BigInteger(), nullable=False),
        sa.Column("errors", sa.BigInteger(), nullable=False),
        sa.Column("slow", sa.BigInteger(), nullable=False),
    )
    op.create_table(
        "alerts",
        sa.Column("id", sa.Uuid(), primary_key=True),
        sa.Column("fingerprint", sa.String(64), nullable=False),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("labels", postgresql.JSONB(), nullable=False),
        sa.Column("annotations", postgresql.JSONB(), nullable=False),
        sa.Column("starts_at", _TZ, nullable=False),
        sa.Column("ends_at", _TZ),
    )
    op.create_index(
        "uq_alerts_firing_fingerprint", "alerts", ["fingerprint"], unique=True,
        postgresql_where=sa.text("status = 'firing'"),
    )  # fmt: skip
    op.create_table(
        "alert_notifications",
        sa.Column("id", sa.Uuid(), primary_key=True),
        sa.Column(
            "alert_id", sa.Uuid(), sa.ForeignKey("alerts.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("payload", postgresql.JSONB(), nullable=False),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("next_attempt_at", _TZ, server_default=sa.func.now(), nullable=False),
        sa.Column("delivered_at", _TZ),
        sa.Column("last_error", sa.Text()),
        sa.Column("created_at", _TZ, server_default=sa.func.now(), nullable=False),
    )


def downgrade() -> None:
    for table in ("alert_notifications", "alerts", "slo_counts", "slos"):
        op.drop_table(table)
