"""The console overview's rollups: usage per tenant, hour, model and latency bucket (a tenant's
overview), per hour, model and latency bucket over every tenant (the fleet view), and per
tenant and day (the busiest tenants).

The ledger writer adds to them in the transaction that inserts the usage rows, so the overview
never scans ``usage_events``. Existing usage is rolled up here once.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

APP = "kiln_app"
TENANT = "kiln_tenant"
TENANT_MATCH = "tenant_id = NULLIF(current_setting('kiln.tenant_id', true), '')::uuid"
PLATFORM = "current_setting('kiln.scope', true) = 'platform'"
# = kiln_platform.billing.rollup.EDGES_MS: a request of latency ms falls in the first bucket
# whose edge is >= ms (the last bucket is open).
EDGES = "ARRAY[5,10,25,50,100,250,500,1000,2500,5000,10000,30000]::float8[]"


_SUMS = [
    sa.Column(name, sa.BigInteger(), nullable=False)
    for name in ("requests", "errors", "input_tokens", "output_tokens", "cost_micros")
]
_BUCKET = f"(SELECT count(*) FROM unnest({EDGES}) e WHERE e < queue_ms + compute_ms)"


def _isolate(table: str) -> None:
    """Row-level security as migration 0010 set it on every tenant table."""
    for role in (APP, TENANT):  # kiln_tenant: tenant-confined transactions (SET LOCAL ROLE)
        op.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON {table} TO {role}")
    op.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
    op.execute(f"ALTER TABLE {table} FORCE ROW LEVEL SECURITY")
    op.execute(f"CREATE POLICY tenant_isolation ON {table} USING ({TENANT_MATCH})")
    op.execute(f"CREATE POLICY platform_scope ON {table} TO {APP}, CURRENT_USER USING ({PLATFORM})")


def upgrade() -> None:
    _tenant_hourly()
    op.create_table(
        "usage_fleet_hourly",
        sa.Column("hour", sa.DateTime(timezone=True), primary_key=True),
        sa.Column("model", sa.String(200), primary_key=True),
        sa.Column("latency_bucket", sa.SmallInteger(), primary_key=True),
        *[c.copy() for c in _SUMS],
    )
    op.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON usage_fleet_hourly TO {APP}")
    op.create_table(
        "usage_tenant_daily",
        sa.Column("day", sa.Date(), primary_key=True),
        sa.Column("tenant_id", sa.Uuid(), sa.ForeignKey("tenants.id", ondelete="CASCADE",
                  name="fk_usage_tenant_daily_tenant_id_tenants"), primary_key=True),
        *[c.copy() for c in _SUMS if c.name in ("requests", "errors", "cost_micros")],
    )  # fmt: skip
    _isolate("usage_tenant_daily")
    op.execute("SELECT set_config('kiln.scope', 'platform', true)")
    op.execute(ROLLUP_SQL["usage_hourly"])
    op.execute(ROLLUP_SQL["usage_fleet_hourly"])
    op.execute(ROLLUP_SQL["usage_tenant_daily"])


ROLLUP_SQL = {
    "usage_hourly": f"""INSERT INTO usage_hourly
        SELECT tenant_id, date_trunc('hour', created_at), model, {_BUCKET}, count(*),
               count(*) FILTER (WHERE status >= 400), sum(input_tokens), sum(output_tokens),
               sum(cost_micros)
        FROM usage_events GROUP BY 1, 2, 3, 4""",
    "usage_fleet_hourly": """INSERT INTO usage_fleet_hourly
        SELECT hour, model, latency_bucket, sum(requests), sum(errors), sum(input_tokens),
               sum(output_tokens), sum(cost_micros)
        FROM usage_hourly GROUP BY 1, 2, 3""",
    "usage_tenant_daily": """INSERT INTO usage_tenant_daily
        SELECT (hour AT TIME ZONE 'UTC')::date, tenant_id, sum(requests), sum(errors),
               sum(cost_micros)
        FROM usage_hourly GROUP BY 1, 2""",
}
"""Existing usage rolled up (``bench/console.py`` seeds with them too)."""


def _tenant_hourly() -> None:
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
    _isolate("usage_hourly")


def downgrade() -> None:
    for table in ("usage_tenant_daily", "usage_fleet_hourly", "usage_hourly"):
        op.drop_table(table)
