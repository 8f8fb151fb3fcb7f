"""A second charge rollup level: per tenant, tenant-local day and model, without the version,
adapter, API key and OAuth client columns.

The costs page by tenant, model and day reads one row of this per group, so PostgreSQL neither
sorts nor hashes tens of thousands of groups (docs/benchmarks.md, issue 18); reports grouped by
tenant, model or day only read it instead of ``usage_charge_daily``. Kept like that one, by a
statement trigger in the transaction that inserts the lines (its own trigger, so each migration
keeps its own), and rebuilt for a tenant whose time zone changes. Existing lines are rolled up
from ``usage_charge_daily``.

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None

APP = "kiln_app"
TENANT = "kiln_tenant"
TENANT_MATCH = "tenant_id = NULLIF(current_setting('kiln.tenant_id', true), '')::uuid"
PLATFORM = "current_setting('kiln.scope', true) = 'platform'"
TABLE = "usage_charge_model_daily"
KEY = "tenant_id, day, kind, model, unit, currency"
_MICROS = sa.BigInteger()


def add_sql(source: str, where: str = "TRUE") -> str:
    """Add the lines of ``source`` (a table or transition table) to the rollup, in key order
    (concurrent writers lock rows in the same order)."""
    return f"""
        INSERT INTO {TABLE} AS d ({KEY}, quantity, list_cost_micros, cost_micros, lines)
        SELECT c.tenant_id, (c.charged_at AT TIME ZONE t.timezone)::date, c.kind, c.model,
               c.unit, c.currency, sum(c.quantity), sum(c.list_cost_micros),
               sum(c.cost_micros), count(*)
        FROM {source} c JOIN tenants t ON t.id = c.tenant_id
        WHERE {where}
        GROUP BY 1, 2, 3, 4, 5, 6
        ORDER BY 1, 2, 3, 4, 5, 6
        ON CONFLICT ({KEY}) DO UPDATE SET
            quantity = d.quantity + excluded.quantity,
            list_cost_micros = d.list_cost_micros + excluded.list_cost_micros,
            cost_micros = d.cost_micros + excluded.cost_micros,
            lines = d.lines + excluded.lines"""


# As the owner (FORCE ROW LEVEL SECURITY: in platform scope for the call only), as 0023's.
_DEFINER = "SECURITY DEFINER SET kiln.scope = 'platform' SET search_path FROM CURRENT"
FUNCTIONS = {
    "kiln_charge_model_daily_add": add_sql("new_lines"),
    "kiln_charge_model_daily_rezone": f"DELETE FROM {TABLE} WHERE tenant_id = NEW.id;"
    + add_sql("usage_charges", "c.tenant_id = NEW.id"),
}


BACKFILL = f"""
    INSERT INTO {TABLE} ({KEY}, quantity, list_cost_micros, cost_micros, lines)
    SELECT {KEY}, sum(quantity), sum(list_cost_micros), sum(cost_micros), sum(lines)
    FROM usage_charge_daily GROUP BY {KEY}"""
"""Existing lines, from 0023's rollup: the same days, a fraction of the rows."""


def upgrade() -> None:
    op.create_table(
        TABLE,
        sa.Column("tenant_id", sa.Uuid(), sa.ForeignKey("tenants.id", ondelete="CASCADE",
                  name=f"fk_{TABLE}_tenant_id_tenants"), primary_key=True),
        sa.Column("day", sa.Date(), primary_key=True),
        sa.Column("kind", sa.String(16), primary_key=True),
        sa.Column("model", sa.String(200), primary_key=True),
        sa.Column("unit", sa.String(16), primary_key=True),
        sa.Column("currency", sa.String(3), primary_key=True),
        sa.Column("quantity", sa.Numeric(), nullable=False),
        sa.Column("list_cost_micros", _MICROS, nullable=False),
        sa.Column("cost_micros", _MICROS, nullable=False),
        sa.Column("lines", _MICROS, nullable=False),
    )  # fmt: skip
    op.create_index(f"ix_{TABLE}_day", TABLE, ["day"])
    for role in (APP, TENANT):
        op.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON {TABLE} TO {role}")
    op.execute(f"ALTER TABLE {TABLE} ENABLE ROW LEVEL SECURITY")
    op.execute(f"ALTER TABLE {TABLE} FORCE ROW LEVEL SECURITY")
    op.execute(f"CREATE POLICY tenant_isolation ON {TABLE} USING ({TENANT_MATCH})")
    op.execute(f"CREATE POLICY platform_scope ON {TABLE} TO {APP}, CURRENT_USER USING ({PLATFORM})")
    for name, body in FUNCTIONS.items():
        op.execute(f"CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql {_DEFINER} AS $$"
                   f" BEGIN {body}; RETURN NULL; END $$")  # fmt: skip
    op.execute("CREATE TRIGGER usage_charges_model_daily AFTER INSERT ON usage_charges"
               " REFERENCING NEW TABLE AS new_lines FOR EACH STATEMENT"
               " EXECUTE FUNCTION kiln_charge_model_daily_add()")  # fmt: skip
    op.execute("CREATE TRIGGER tenants_charge_model_daily AFTER UPDATE OF timezone ON tenants"
               " FOR EACH ROW WHEN (OLD.timezone IS DISTINCT FROM NEW.timezone)"
               " EXECUTE FUNCTION kiln_charge_model_daily_rezone()")  # fmt: skip
    op.execute("SELECT set_config('kiln.scope', 'platform', true)")
    op.execute(f"DELETE FROM {TABLE}")  # idempotent: the rollup is rebuilt whole
    op.execute(BACKFILL)


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS tenants_charge_model_daily ON tenants")
    op.execute("DROP TRIGGER IF EXISTS usage_charges_model_daily ON usage_charges")
    for name in FUNCTIONS:
        op.execute(f"DROP FUNCTION IF EXISTS {name}()")
    op.drop_table(TABLE)
