"""Stored chat completions: ``/v1/chat/completions`` with ``store: true`` keeps the completion
and the messages it answered (sealed: tenant data), so its tenant can list, read, tag (metadata)
and delete them (OpenAI's stored chat completions), under row-level security like
``responses``. The model is in the clear: the list filters by it.

Revision ID: 0032
Revises: 0031
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0032"
down_revision = "0031"
branch_labels = None
depends_on = None

APP = "kiln_app"
TENANT = "kiln_tenant"
TENANT_MATCH = "tenant_id = NULLIF(current_setting('kiln.tenant_id', true), '')::uuid"
PLATFORM = "current_setting('kiln.scope', true) = 'platform'"
_TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "chat_completions",
        sa.Column("id", sa.String(120), primary_key=True),
        sa.Column("tenant_id", sa.Uuid(), sa.ForeignKey("tenants.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("sealed", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", _TZ, server_default=sa.func.now(), nullable=False),
        sa.Column("expires_at", _TZ, nullable=False),
    )  # fmt: skip
    op.create_index(
        "ix_chat_completions_tenant_created", "chat_completions", ["tenant_id", "created_at", "id"]
    )
    for role in (APP, TENANT):
        op.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON chat_completions TO {role}")
    op.execute("ALTER TABLE chat_completions ENABLE ROW LEVEL SECURITY")
    op.execute("ALTER TABLE chat_completions FORCE ROW LEVEL SECURITY")
    op.execute(f"CREATE POLICY tenant_isolation ON chat_completions USING ({TENANT_MATCH})")
    op.execute(
        f"CREATE POLICY platform_scope ON chat_completions TO {APP}, CURRENT_USER "
        f"USING ({PLATFORM})"
    )


def downgrade() -> None:
    op.drop_table("chat_completions")
