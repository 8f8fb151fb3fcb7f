"""A tenant's API keys by index: the key list pages a tenant's keys newest first, and deleting a
tenant cascades to its keys; both read ``api_keys`` by ``tenant_id``, which had no index (the
table was scanned whole for every tenant's page).

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-04
"""

from __future__ import annotations

from alembic import op

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_api_keys_tenant_created", "api_keys", ["tenant_id", "created_at", "id"])


def downgrade() -> None:
    op.drop_index("ix_api_keys_tenant_created", table_name="api_keys")
