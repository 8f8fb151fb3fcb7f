"""Usage per tenant, model, hour and latency bucket: the console overview's rollup.

The ledger writer adds to it in the transaction that inserts the usage rows, so the overview
reads a few hundred rows per tenant and never scans ``usage_events``. Existing usage is rolled
up here once.

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

APP = "kiln_app"
TENANT = "kiln_tenant"
TENANT_MATCH = "tenant_id = NULLIF(current_setting('kiln.tenant_id', true), '')::uuid"
PLATFORM = "current_setting('kiln.scope', true) = 'platform'"
# = kiln_platform.billing.rollup.EDGES_MS: a request of latency ms falls in the first bucket
# whose edge is >= ms (the last bucket is open).
EDGES = "ARRAY[5,10,25,50,100,250,500,1000,2500,5000,10000,30000]::float8[]"


def upgrade() -> None:
    op.create_table(
        "usage_hourly",
        sa.Column("tenant_id", sa.Uuid(), nullable=False),
        sa.Column("hour", sa.DateTime(timezone=True), nullable=False),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("latency_bucket", sa.SmallInteger(), nullable=False),
        sa.Column("requests", sa.BigInteger(), nullable=False),
        sa.Column("errors", sa.BigInteger(), nullable=False),
        sa.Column("input_tokens", sa.BigInteger(), nullable=False),
        sa.Column("output_tokens", sa.BigInteger(), nullable=False),
        sa.Column("cost_micros", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint(
            "tenant_id", "hour", "model", "latency_bucket", name="pk_usage_hourly"
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name="fk_usage_hourly_tenant_id_tenants",
            ondelete="CASCADE",
        ),
    )  # fmt: skip
    op.create_index("ix_usage_hourly_hour", "usage_hourly", ["hour"])
    for role in (APP, TENANT):  # kiln_tenant: tenant-confined transactions (SET LOCAL ROLE)
        op.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON usage_hourly TO {role}")
    op.execute("ALTER TABLE usage_hourly ENABLE ROW LEVEL SECURITY")
    op.execute("ALTER TABLE usage_hourly FORCE ROW LEVEL SECURITY")
    op.execute(f"CREATE POLICY tenant_isolation ON usage_hourly USING ({TENANT_MATCH})")
    op.execute(
        f"CREATE POLICY platform_scope ON usage_hourly TO {APP}, CURRENT_USER USING ({PLATFORM})"
    )
    op.execute("SELECT set_config('kiln.scope', 'platform', true)")
    op.execute(
        f"""
        INSERT INTO usage_hourly
        SELECT tenant_id, date_trunc('hour', created_at), model,
               (SELECT count(*) FROM unnest({EDGES}) e WHERE e < queue_ms + compute_ms),
               count(*), count(*) FILTER (WHERE status >= 400),
               sum(input_tokens), sum(output_tokens), sum(cost_micros)
        FROM usage_events GROUP BY 1, 2, 3, 4
        """
    )


def downgrade() -> None:
    op.drop_table("usage_hourly")
