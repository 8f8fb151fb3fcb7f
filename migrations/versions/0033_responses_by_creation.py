"""Stored responses by creation: the console's Logs page lists a tenant's stored responses
newest first, one index range of ``(tenant_id, created_at, id)`` from the page's last row (the
table had only ``(tenant_id, expires_at)``, for dropping expired rows).

Revision ID: 0033
Revises: 0032
Create Date: 2026-12-05
"""

from __future__ import annotations

from alembic import op

revision = "0033"
down_revision = "0032"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_responses_tenant_created", "responses", ["tenant_id", "created_at", "id"])


def downgrade() -> None:
    op.drop_index("ix_responses_tenant_created", table_name="responses")
