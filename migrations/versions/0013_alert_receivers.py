"""Alert receivers as data: webhooks with sealed signing keys, and deliveries to each.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

_TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "alert_receivers",
        sa.Column("id", sa.Uuid(), primary_key=True),
        sa.Column("name", sa.String(100), nullable=False, unique=True),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("secret_sealed", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", _TZ, server_default=sa.func.now(), nullable=False),
    )
    op.create_table(
        "alert_deliveries",
        sa.Column(
            "notification_id", sa.Uuid(),
            sa.ForeignKey("alert_notifications.id", ondelete="CASCADE"), primary_key=True,
        ),
        sa.Column(
            "receiver_id", sa.Uuid(), sa.ForeignKey("alert_receivers.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("next_attempt_at", _TZ, server_default=sa.func.now(), nullable=False),
        sa.Column("delivered_at", _TZ),
        sa.Column("last_error", sa.Text()),
    )  # fmt: skip


def downgrade() -> None:
    for table in ("alert_deliveries", "alert_receivers"):
        op.drop_table(table)
