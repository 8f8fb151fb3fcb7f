"""Row-level security forced on every tenant table, the non-owner ``kiln_app`` role the app
connects as, and OAuth signing keys sealed at rest.

Every table with a ``tenant_id`` column (and ``tenants`` itself, by ``id``) gets ``FORCE ROW
LEVEL SECURITY`` and two permissive policies: ``tenant_isolation`` (any role: the row's tenant is
``kiln.tenant_id``) and ``platform_scope`` (``kiln_app`` and the owner: the transaction declared
``kiln.scope = 'platform'``). A transaction that declares neither sees no tenant row. The
``kiln_tenant`` role (tenant-confined admin actions) has no platform policy at all.

``kiln_app`` gets data privileges only (no ownership, no DDL, no ``BYPASSRLS``); default
privileges give it the same on tables later migrations create.

Signing keys: ``private_pem`` (plaintext PEM) becomes ``private_sealed`` (AES-256-GCM under a
key derived from the server secret, the ``kid`` as associated data); existing keys are sealed
here, so this step needs the server secret when the table has rows.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from kiln_platform.sealing import Seal

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

APP = "kiln_app"
TENANT = "kiln_tenant"
SIGNING_KEY_PURPOSE = b"kiln oauth signing key v1"  # = kiln_platform.oauth.keys.PURPOSE
TENANT_MATCH = "{column} = NULLIF(current_setting('kiln.tenant_id', true), '')::uuid"
PLATFORM = "current_setting('kiln.scope', true) = 'platform'"


def tenant_tables() -> dict[str, str]:
    """Each tenant table and the column naming its tenant, read from the schema."""
    rows = op.get_bind().execute(
        sa.text(
            "SELECT table_name FROM information_schema.columns WHERE table_schema ="
            " current_schema() AND column_name = 'tenant_id' ORDER BY table_name"
        )
    )
    return {"tenants": "id", **{name: "tenant_id" for (name,) in rows}}


def _secret() -> bytes:
    secret = op.get_context().config.attributes.get("secret")
    if secret is None:
        raise RuntimeError("migration 0010 seals the OAuth signing keys: it needs the secret")
    return bytes(secret)


def upgrade() -> None:
    op.execute(
        f"""
        DO $$ BEGIN
            IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{APP}') THEN
                CREATE ROLE {APP} NOLOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE;
            END IF;
        END $$;
        """
    )
    op.execute(f"GRANT {TENANT} TO {APP}")  # tenant-confined actions: SET LOCAL ROLE kiln_tenant
    op.execute(f"GRANT {APP} TO current_user")  # the fallback: each connection SET ROLE kiln_app
    op.execute(f"GRANT USAGE ON SCHEMA public TO {APP}")
    op.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {APP}")
    op.execute(f"REVOKE INSERT, UPDATE, DELETE ON alembic_version FROM {APP}")
    op.execute(f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO {APP}")
    op.execute(
        "ALTER DEFAULT PRIVILEGES IN SCHEMA public"
        f" GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO {APP}"
    )
    op.execute(f"ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT USAGE ON SEQUENCES TO {APP}")
    for table, column in tenant_tables().items():
        op.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
        op.execute(f"ALTER TABLE {table} FORCE ROW LEVEL SECURITY")
        op.execute(f"DROP POLICY IF EXISTS tenant_isolation ON {table}")
        op.execute(
            f"CREATE POLICY tenant_isolation ON {table} USING "
            f"({TENANT_MATCH.format(column=column)})"
        )
        op.execute(
            f"CREATE POLICY platform_scope ON {table} TO {APP}, CURRENT_USER USING ({PLATFORM})"
        )
    _seal_signing_keys()


def _seal_signing_keys() -> None:
    op.add_column("oauth_signing_keys", sa.Column("private_sealed", sa.LargeBinary()))
    bind = op.get_bind()
    rows = bind.execute(sa.text("SELECT kid, private_pem FROM oauth_signing_keys")).all()
    if rows:
        seal = Seal(_secret(), SIGNING_KEY_PURPOSE)
        for kid, pem in rows:
            bind.execute(
                sa.text("UPDATE oauth_signing_keys SET private_sealed = :s WHERE kid = :k"),
                {"s": seal.seal(pem.encode(), kid.encode()), "k": kid},
            )
    op.alter_column("oauth_signing_keys", "private_sealed", nullable=False)
    op.drop_column("oauth_signing_keys", "private_pem")


def downgrade() -> None:
    op.add_column("oauth_signing_keys", sa.Column("private_pem", sa.Text()))
    bind = op.get_bind()
    rows = bind.execute(sa.text("SELECT kid, private_sealed FROM oauth_signing_keys")).all()
    if rows:
        seal = Seal(_secret(), SIGNING_KEY_PURPOSE)
        for kid, sealed in rows:
            bind.execute(
                sa.text("UPDATE oauth_signing_keys SET private_pem = :p WHERE kid = :k"),
                {"p": seal.open(sealed, kid.encode()).decode(), "k": kid},
            )
    op.alter_column("oauth_signing_keys", "private_pem", nullable=False)
    op.drop_column("oauth_signing_keys", "private_sealed")
    for table, column in tenant_tables().items():
        op.execute(f"DROP POLICY IF EXISTS platform_scope ON {table}")
        op.execute(f"DROP POLICY IF EXISTS tenant_isolation ON {table}")
        op.execute(
            f"CREATE POLICY tenant_isolation ON {table} TO {TENANT} USING "
            f"({TENANT_MATCH.format(column=column)})"
        )
        op.execute(f"ALTER TABLE {table} NO FORCE ROW LEVEL SECURITY")
    op.execute(f"ALTER DEFAULT PRIVILEGES IN SCHEMA public REVOKE ALL ON TABLES FROM {APP}")
    op.execute(f"ALTER DEFAULT PRIVILEGES IN SCHEMA public REVOKE ALL ON SEQUENCES FROM {APP}")
    op.execute(f"REVOKE ALL ON ALL TABLES IN SCHEMA public FROM {APP}")
    op.execute(f"REVOKE ALL ON ALL SEQUENCES IN SCHEMA public FROM {APP}")
    op.execute(f"REVOKE USAGE ON SCHEMA public FROM {APP}")
    op.execute(f"REVOKE {TENANT} FROM {APP}")
