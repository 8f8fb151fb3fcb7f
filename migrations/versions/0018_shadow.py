"""Shadow traffic: a model's shadow candidate and share, and each gateway's comparison report.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

_TZ = sa.DateTime(timezone=True)


def _model_id() -> sa.Column[object]:
    return sa.Column(
        "model_id", sa.Uuid(), sa.ForeignKey("models.id", ondelete="CASCADE"), primary_key=True
    )


def upgrade() -> None:
    op.create_table(
        "model_shadows",
        _model_id(),
        sa.Column("version", sa.String(64), nullable=False),
        sa.Column("percent", sa.SmallInteger(), nullable=False),
        sa.Column("updated_at", _TZ, server_default=sa.func.now(), nullable=False),
        sa.CheckConstraint("percent BETWEEN 0 AND 100", name="ck_model_shadows_percent_range"),
    )
    op.create_table(
        "shadow_reports",
        _model_id(),
        sa.Column("candidate", sa.String(64), primary_key=True),
        sa.Column("gateway", sa.String(200), primary_key=True),
        sa.Column("report", postgresql.JSONB(), nullable=False),
        sa.Column("updated_at", _TZ, server_default=sa.func.now(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("shadow_reports")
    op.drop_table("model_shadows")
