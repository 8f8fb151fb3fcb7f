"""Conversations (OpenAI's Conversations API, and ``conversation`` on ``/v1/responses``): a
conversation and its items, each item sealed (tenant data), in tenant tables under row-level
security like ``responses``. Items are kept once each, in order (``position``), so a long
conversation costs its items, not its turns times its history.

Revision ID: 0031
Revises: 0030
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0031"
down_revision = "0030"
branch_labels = None
depends_on = None

APP = "kiln_app"
TENANT = "kiln_tenant"
TENANT_MATCH = "tenant_id = NULLIF(current_setting('kiln.tenant_id', true), '')::uuid"
PLATFORM = "current_setting('kiln.scope', true) = 'platform'"


def _tenant_table(name: str) -> None:
    for role in (APP, TENANT):
        op.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON {name} TO {role}")
    op.execute(f"ALTER TABLE {name} ENABLE ROW LEVEL SECURITY")
    op.execute(f"ALTER TABLE {name} FORCE ROW LEVEL SECURITY")
    op.execute(f"CREATE POLICY tenant_isolation ON {name} USING ({TENANT_MATCH})")
    op.execute(f"CREATE POLICY platform_scope ON {name} TO {APP}, CURRENT_USER USING ({PLATFORM})")


def upgrade() -> None:
    def tenant() -> sa.ForeignKey:
        return sa.ForeignKey("tenants.id", ondelete="CASCADE")

    op.create_table(
        "conversations",
        sa.Column("id", sa.String(80), primary_key=True),
        sa.Column("tenant_id", sa.Uuid(), tenant(), nullable=False),
        sa.Column("sealed", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(),
                  nullable=False),
    )  # fmt: skip
    op.create_index("ix_conversations_tenant", "conversations", ["tenant_id"])
    op.create_table(
        "conversation_items",
        sa.Column("conversation_id", sa.String(80),
                  sa.ForeignKey("conversations.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("id", sa.String(120), primary_key=True),
        sa.Column("tenant_id", sa.Uuid(), tenant(), nullable=False),
        sa.Column("position", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("sealed", sa.LargeBinary(), nullable=False),
    )  # fmt: skip
    op.create_index(
        "ix_conversation_items_position", "conversation_items", ["conversation_id", "position"]
    )
    _tenant_table("conversations")
    _tenant_table("conversation_items")
    op.execute(f"GRANT USAGE ON SEQUENCE conversation_items_position_seq TO {APP}, {TENANT}")


def downgrade() -> None:
    op.drop_table("conversation_items")
    op.drop_table("conversations")
