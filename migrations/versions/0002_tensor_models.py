"""Tensor models: compile jobs (one row per engine cache key).

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

_TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "compile_jobs",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("model_version_id", sa.Uuid(), nullable=False),
        sa.Column("cache_key", sa.String(71), nullable=False),
        sa.Column("target", sa.String(16), nullable=False),
        sa.Column("precision", sa.String(8), nullable=False),
        sa.Column("hardware", sa.String(200), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("engine_digest", sa.String(71), nullable=True),
        sa.Column("report", postgresql.JSONB(), nullable=True),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("created_at", _TS, server_default=sa.func.now(), nullable=False),
        sa.Column("started_at", _TS, nullable=True),
        sa.Column("finished_at", _TS, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_compile_jobs"),
        sa.UniqueConstraint("cache_key", name="uq_compile_jobs_cache_key"),
        sa.CheckConstraint(
            "status IN ('queued', 'running', 'done', 'failed')", name="ck_compile_jobs_status"
        ),
        sa.ForeignKeyConstraint(
            ["model_version_id"], ["model_versions.id"],
            name="fk_compile_jobs_model_version_id_model_versions", ondelete="CASCADE",
        ),
    )
    op.create_index("ix_compile_jobs_status_created", "compile_jobs", ["status", "created_at"])


def downgrade() -> None:
    op.drop_table("compile_jobs")
