"""Usage per API key and per OAuth client by day: indexes, so the keys and clients pages read
seven days of one tenant's keys by index range instead of scanning the tenant's usage.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-01
"""

from __future__ import annotations

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_usage_events_key_created", "usage_events", ["api_key_id", "created_at"])
    op.create_index(
        "ix_usage_events_client_created", "usage_events", ["oauth_client_id", "created_at"]
    )


def downgrade() -> None:
    op.drop_index("ix_usage_events_client_created", table_name="usage_events")
    op.drop_index("ix_usage_events_key_created", table_name="usage_events")
