"""Charge lines rolled up per tenant, tenant-local day and the cost report's dimensions.

Finance's pages read this instead of every charge line of a month (docs/benchmarks.md, issue
18). Triggers keep it, so every path that inserts charge lines does, in the same transaction:
the ledger's flush, batch lines and adjustments alike. A statement trigger adds each insert's
lines (grouped, in key order so concurrent writers lock rows in the same order); a tenant whose
time zone changes has its days rebuilt from its lines. Existing lines are rolled up here.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None

APP = "kiln_app"
TENANT = "kiln_tenant"
TENANT_MATCH = "tenant_id = NULLIF(current_setting('kiln.tenant_id', true), '')::uuid"
PLATFORM = "current_setting('kiln.scope', true) = 'platform'"
TABLE = "usage_charge_daily"
KEY = "tenant_id, day, kind, model, version, adapter, api_key_id, oauth_client_id, unit, currency"
_MICROS = sa.BigInteger()


def add_sql(source: str, where: str = "TRUE") -> str:
    """Add the lines of ``source`` (a table or transition table) to the rollup."""
    return f"""
        INSERT INTO {TABLE} AS d ({KEY}, quantity, list_cost_micros, cost_micros, lines)
        SELECT c.tenant_id, (c.charged_at AT TIME ZONE t.timezone)::date, c.kind, c.model,
               c.version, c.adapter, c.api_key_id, c.oauth_client_id, c.unit, c.currency,
               sum(c.quantity), sum(c.list_cost_micros), sum(c.cost_micros), count(*)
        FROM {source} c JOIN tenants t ON t.id = c.tenant_id
        WHERE {where}
        GROUP BY 1, 2, 3, 4, 5, 6, 7, 8, 9, 10
        ORDER BY 1, 2, 3, 4, 5, 6, 7, 8, 9, 10
        ON CONFLICT ({KEY}) DO UPDATE SET
            quantity = d.quantity + excluded.quantity,
            list_cost_micros = d.list_cost_micros + excluded.list_cost_micros,
            cost_micros = d.cost_micros + excluded.cost_micros,
            lines = d.lines + excluded.lines"""


# As the owner (FORCE ROW LEVEL SECURITY: in platform scope for the call only), so a writer in
# any scope, or a tenant-confined one, keeps every tenant's rows it may write lines for.
_DEFINER = "SECURITY DEFINER SET kiln.scope = 'platform' SET search_path FROM CURRENT"
FUNCTIONS = {
    "kiln_charge_daily_add": add_sql("new_lines"),
    "kiln_charge_daily_rezone": f"DELETE FROM {TABLE} WHERE tenant_id = NEW.id;"
    + add_sql("usage_charges", "c.tenant_id = NEW.id"),
}


def upgrade() -> None:
    op.create_table(
        TABLE,
        sa.Column("id", sa.BigInteger(), sa.Identity(), primary_key=True),
        sa.Column("tenant_id", sa.Uuid(), sa.ForeignKey("tenants.id", ondelete="CASCADE",
                  name=f"fk_{TABLE}_tenant_id_tenants"), nullable=False),
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("version", sa.String(64), nullable=False),
        sa.Column("adapter", sa.String(200), nullable=True),
        sa.Column("api_key_id", sa.Uuid(), nullable=True),
        sa.Column("oauth_client_id", sa.Uuid(), nullable=True),
        sa.Column("unit", sa.String(16), nullable=False),
        sa.Column("currency", sa.String(3), nullable=False),
        sa.Column("quantity", sa.Numeric(), nullable=False),
        sa.Column("list_cost_micros", _MICROS, nullable=False),
        sa.Column("cost_micros", _MICROS, nullable=False),
        sa.Column("lines", _MICROS, nullable=False),
    )  # fmt: skip
    op.execute(f"CREATE UNIQUE INDEX uq_{TABLE}_key ON {TABLE} ({KEY}) NULLS NOT DISTINCT")
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
    op.execute("CREATE TRIGGER usage_charges_daily AFTER INSERT ON usage_charges"
               " REFERENCING NEW TABLE AS new_lines FOR EACH STATEMENT"
               " EXECUTE FUNCTION kiln_charge_daily_add()")  # fmt: skip
    op.execute("CREATE TRIGGER tenants_charge_daily AFTER UPDATE OF timezone ON tenants"
               " FOR EACH ROW WHEN (OLD.timezone IS DISTINCT FROM NEW.timezone)"
               " EXECUTE FUNCTION kiln_charge_daily_rezone()")  # fmt: skip
    op.execute("SELECT set_config('kiln.scope', 'platform', true)")
    op.execute(f"DELETE FROM {TABLE}")  # idempotent: the rollup is rebuilt whole
    op.execute(add_sql("usage_charges"))


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS tenants_charge_daily ON tenants")
    op.execute("DROP TRIGGER IF EXISTS usage_charges_daily ON usage_charges")
    for name in FUNCTIONS:
        op.execute(f"DROP FUNCTION IF EXISTS {name}()")
    op.drop_table(TABLE)
