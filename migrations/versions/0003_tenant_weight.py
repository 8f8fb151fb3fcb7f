"""Tenants get a fair-share weight.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("tenants", sa.Column("weight", sa.Float(), server_default="1", nullable=False))
    op.create_check_constraint("weight_positive", "tenants", "weight > 0")


def downgrade() -> None:
    op.drop_constraint("ck_tenants_weight_positive", "tenants")
    op.drop_column("tenants", "weight")
