"""Stored responses: ``/v1/responses`` with ``store: true`` keeps the response and the input
items it answered (sealed: tenant data), so a later request goes on from it
(``previous_response_id``) and its tenant can read or delete it (row-level security by tenant,
as on every tenant table).

Revision ID: 0028
Revises: 0027
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None

APP = "kiln_app"
TENANT = "kiln_tenant"
TENANT_MATCH = "tenant_id = NULLIF(current_setting('kiln.tenant_id', true), '')::uuid"
PLATFORM = "current_setting('kiln.scope', true) = 'platform'"
_TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "responses",
        sa.Column("id", sa.String(80), primary_key=True),
        sa.Column(
            "tenant_id", sa.Uuid(), sa.ForeignKey("tenants.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("sealed", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", _TZ, server_default=sa.func.now(), nullable=False),
        sa.Column("expires_at", _TZ, nullable=False),
    )  # fmt: skip
    op.create_index("ix_responses_tenant_expires", "responses", ["tenant_id", "expires_at"])
    for role in (APP, TENANT):
        op.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON responses TO {role}")
    op.execute("ALTER TABLE responses ENABLE ROW LEVEL SECURITY")
    op.execute("ALTER TABLE responses FORCE ROW LEVEL SECURITY")
    op.execute(f"CREATE POLICY tenant_isolation ON responses USING ({TENANT_MATCH})")
    op.execute(
        f"CREATE POLICY platform_scope ON responses TO {APP}, CURRENT_USER USING ({PLATFORM})"
    )


def downgrade() -> None:
    op.drop_table("responses")
