"""Failed console sign-ins, shared by every gateway process (the sign-in throttle).

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "signin_failures",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("key", sa.String(400), nullable=False),
        sa.Column(
            "failed_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("id", name="pk_signin_failures"),
    )
    op.create_index("ix_signin_failures_key_failed_at", "signin_failures", ["key", "failed_at"])


def downgrade() -> None:
    op.drop_table("signin_failures")
