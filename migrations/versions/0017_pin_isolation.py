"""Row-level security on ``model_pins``: it names tenants, so a tenant-confined transaction sees
its own pins only, like every other table with a ``tenant_id`` (migration 0010). Gateways read
pins in platform scope (the Resolver's catalog); platform-admins write them there.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-02
"""

from __future__ import annotations

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

APP = "kiln_app"
TENANT = "kiln_tenant"
TENANT_MATCH = "tenant_id = NULLIF(current_setting('kiln.tenant_id', true), '')::uuid"
PLATFORM = "current_setting('kiln.scope', true) = 'platform'"


def upgrade() -> None:
    for role in (APP, TENANT):
        op.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON model_pins TO {role}")
    op.execute("ALTER TABLE model_pins ENABLE ROW LEVEL SECURITY")
    op.execute("ALTER TABLE model_pins FORCE ROW LEVEL SECURITY")
    op.execute(f"CREATE POLICY tenant_isolation ON model_pins USING ({TENANT_MATCH})")
    op.execute(
        f"CREATE POLICY platform_scope ON model_pins TO {APP}, CURRENT_USER USING ({PLATFORM})"
    )


def downgrade() -> None:
    op.execute("DROP POLICY platform_scope ON model_pins")
    op.execute("DROP POLICY tenant_isolation ON model_pins")
    op.execute("ALTER TABLE model_pins NO FORCE ROW LEVEL SECURITY")
    op.execute("ALTER TABLE model_pins DISABLE ROW LEVEL SECURITY")
    op.execute(f"REVOKE ALL ON model_pins FROM {TENANT}")
