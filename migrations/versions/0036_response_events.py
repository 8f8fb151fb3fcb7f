"""A streamed background response's events as runs appended while it streams
(``response_events``: each write adds the events made since the last, sealed), where each
write replaced the whole list in ``responses.events`` (its bytes the square of the stream's).
``responses.events`` stays: empty marks a streamed response (a response stored before this
keeps its events there). Row-level security by tenant, as on every tenant table.

Revision ID: 0036
Revises: 0035
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0036"
down_revision = "0035"
branch_labels = None
depends_on = None

APP = "kiln_app"
TENANT = "kiln_tenant"
TENANT_MATCH = "tenant_id = NULLIF(current_setting('kiln.tenant_id', true), '')::uuid"
PLATFORM = "current_setting('kiln.scope', true) = 'platform'"


def upgrade() -> None:
    op.create_table(
        "response_events",
        sa.Column(
            "response_id", sa.String(80), sa.ForeignKey("responses.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("first", sa.Integer(), primary_key=True),
        sa.Column("until", sa.Integer(), nullable=False),
        sa.Column(
            "tenant_id", sa.Uuid(), sa.ForeignKey("tenants.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("sealed", sa.LargeBinary(), nullable=False),
    )  # fmt: skip
    for role in (APP, TENANT):
        op.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON response_events TO {role}")
    op.execute("ALTER TABLE response_events ENABLE ROW LEVEL SECURITY")
    op.execute("ALTER TABLE response_events FORCE ROW LEVEL SECURITY")
    op.execute(f"CREATE POLICY tenant_isolation ON response_events USING ({TENANT_MATCH})")
    op.execute(
        f"CREATE POLICY platform_scope ON response_events TO {APP}, CURRENT_USER "
        f"USING ({PLATFORM})"
    )


def downgrade() -> None:
    op.drop_table("response_events")
