"""Automatic canary analysis: rollouts, their per-step counts, and a route's split.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

_TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.add_column(
        "model_routes",
        sa.Column("canary_split", sa.String(8), server_default="tenant", nullable=False),
    )
    op.create_table(
        "model_rollouts",
        sa.Column("id", sa.Uuid(), primary_key=True),
        sa.Column("model_id", sa.Uuid(), sa.ForeignKey("models.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("stable_version", sa.String(64), nullable=False),
        sa.Column("canary_version", sa.String(64), nullable=False),
        sa.Column("plan", postgresql.JSONB(), nullable=False),
        sa.Column("state", sa.String(16), server_default="running", nullable=False),
        sa.Column("step", sa.SmallInteger(), server_default="0", nullable=False),
        sa.Column("step_started_at", _TZ, nullable=False),
        sa.Column("history", postgresql.JSONB(), server_default="[]", nullable=False),
        sa.Column("created_by", sa.String(200), nullable=False),
        sa.Column("created_at", _TZ, server_default=sa.func.now(), nullable=False),
        sa.Column("finished_at", _TZ),
    )  # fmt: skip
    op.create_index(
        "uq_model_rollouts_running", "model_rollouts", ["model_id"], unique=True,
        postgresql_where=sa.text("state = 'running'"),
    )  # fmt: skip
    op.create_table(
        "rollout_counts",
        sa.Column("rollout_id", sa.Uuid(),
                  sa.ForeignKey("model_rollouts.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("step", sa.SmallInteger(), primary_key=True),
        sa.Column("gateway", sa.Uuid(), primary_key=True),
        sa.Column("arm", sa.String(8), primary_key=True),
        sa.Column("total", sa.BigInteger(), nullable=False),
        sa.Column("errors", sa.BigInteger(), nullable=False),
        sa.Column("degenerate", sa.BigInteger(), nullable=False),
        sa.Column("latency", postgresql.JSONB(), nullable=False),
    )  # fmt: skip


def downgrade() -> None:
    op.drop_table("rollout_counts")
    op.drop_table("model_rollouts")
    op.drop_column("model_routes", "canary_split")
