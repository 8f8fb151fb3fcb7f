"""Outbound webhooks of tenants: endpoints, the deliveries outbox and its attempts (row-level
security by tenant, as on every tenant table).

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None

APP = "kiln_app"
TENANT = "kiln_tenant"
TENANT_MATCH = "tenant_id = NULLIF(current_setting('kiln.tenant_id', true), '')::uuid"
PLATFORM = "current_setting('kiln.scope', true) = 'platform'"
_TZ = sa.DateTime(timezone=True)
_TABLES = ("webhook_endpoints", "webhook_deliveries", "webhook_attempts")


def _tenant() -> sa.Column[object]:
    return sa.Column(
        "tenant_id", sa.Uuid(), sa.ForeignKey("tenants.id", ondelete="CASCADE"), nullable=False
    )


def _now(name: str) -> sa.Column[object]:
    return sa.Column(name, _TZ, server_default=sa.func.now(), nullable=False)


def _isolate(table: str) -> None:
    """Row-level security as migration 0010 set it on every tenant table."""
    for role in (APP, TENANT):  # kiln_tenant: tenant-confined transactions (SET LOCAL ROLE)
        op.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON {table} TO {role}")
    op.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
    op.execute(f"ALTER TABLE {table} FORCE ROW LEVEL SECURITY")
    op.execute(f"CREATE POLICY tenant_isolation ON {table} USING ({TENANT_MATCH})")
    op.execute(f"CREATE POLICY platform_scope ON {table} TO {APP}, CURRENT_USER USING ({PLATFORM})")


def upgrade() -> None:
    op.create_table(
        "webhook_endpoints",
        sa.Column("id", sa.Uuid(), primary_key=True),
        _tenant(),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("description", sa.String(200), server_default="", nullable=False),
        sa.Column("events", postgresql.ARRAY(sa.String(64)), nullable=False),
        sa.Column("enabled", sa.Boolean(), server_default=sa.true(), nullable=False),
        sa.Column("secret_sealed", sa.LargeBinary(), nullable=False),
        sa.Column("previous_sealed", sa.LargeBinary()),
        sa.Column("previous_until", _TZ),
        _now("created_at"),
    )
    op.create_index("ix_webhook_endpoints_tenant_id", "webhook_endpoints", ["tenant_id"])
    op.create_table(
        "webhook_deliveries",
        sa.Column("id", sa.Uuid(), primary_key=True),
        _tenant(),
        sa.Column("endpoint_id", sa.Uuid(),
                  sa.ForeignKey("webhook_endpoints.id", ondelete="CASCADE"), nullable=False),
        sa.Column("event_type", sa.String(64), nullable=False),
        sa.Column("payload", postgresql.JSONB(), nullable=False),
        sa.Column("state", sa.String(16), server_default="pending", nullable=False),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("last_code", sa.SmallInteger()),
        _now("next_attempt_at"),
        _now("window_from"),
        _now("created_at"),
        sa.Column("delivered_at", _TZ),
    )  # fmt: skip
    op.create_index("ix_webhook_deliveries_endpoint", "webhook_deliveries",
                    ["endpoint_id", "created_at"])  # fmt: skip
    op.create_index(
        "ix_webhook_deliveries_due", "webhook_deliveries", ["next_attempt_at"],
        postgresql_where=sa.text("state = 'pending'"),
    )  # fmt: skip
    op.create_table(
        "webhook_attempts",
        sa.Column("id", sa.BigInteger(), sa.Identity(), primary_key=True),
        _tenant(),
        sa.Column("delivery_id", sa.Uuid(),
                  sa.ForeignKey("webhook_deliveries.id", ondelete="CASCADE"), nullable=False),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("response_code", sa.SmallInteger()),
        sa.Column("duration_ms", sa.Float(), nullable=False),
        sa.Column("error", sa.Text()),
        _now("at"),
    )  # fmt: skip
    op.create_index("ix_webhook_attempts_delivery", "webhook_attempts", ["delivery_id", "at"])
    for table in _TABLES:
        _isolate(table)


def downgrade() -> None:
    for table in reversed(_TABLES):
        op.drop_table(table)
