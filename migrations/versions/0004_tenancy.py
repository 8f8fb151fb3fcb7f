"""Tenancy and identity: users and roles, key roles, quotas and their counters, the audit log,
OAuth clients and signing keys, and row-level security on tenant tables.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_TS = sa.DateTime(timezone=True)
ROLES = "('platform-admin', 'tenant-admin', 'tenant-member', 'finance')"
# Tables whose rows belong to one tenant: the row-level-security policies below cover them.
TENANT_TABLES = {
    "tenants": "id",
    "api_keys": "tenant_id",
    "users": "tenant_id",
    "quotas": "tenant_id",
    "oauth_clients": "tenant_id",
    "usage_events": "tenant_id",
    "audit_log": "tenant_id",
}
APP_ROLE = "kiln_tenant"


def _tenant_fk(table: str, nullable: bool = False) -> list[sa.SchemaItem]:
    return [
        sa.Column("tenant_id", sa.Uuid(), nullable=nullable),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=f"fk_{table}_tenant_id_tenants", ondelete="CASCADE"
        ),
    ]


def upgrade() -> None:
    op.add_column(
        "api_keys",
        sa.Column("role", sa.String(32), server_default="tenant-member", nullable=False),
    )
    op.create_check_constraint("role", "api_keys", f"role IN {ROLES}")
    op.create_table(
        "users",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("email", sa.String(320), nullable=False),
        sa.Column("password_hash", sa.Text(), nullable=False),
        sa.Column("role", sa.String(32), nullable=False),
        *_tenant_fk("users", nullable=True),
        sa.Column("created_at", _TS, server_default=sa.func.now(), nullable=False),
        sa.Column("last_login_at", _TS, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_users"),
        sa.UniqueConstraint("email", name="uq_users_email"),
        sa.CheckConstraint(f"role IN {ROLES}", name="ck_users_role"),
        sa.CheckConstraint(
            "tenant_id IS NOT NULL OR role IN ('platform-admin', 'finance')",
            name="ck_users_tenant_role",
        ),
    )
    op.create_table(
        "quotas",
        sa.Column("id", sa.Uuid(), nullable=False),
        *_tenant_fk("quotas"),
        sa.Column("api_key_id", sa.Uuid(), nullable=True),
        sa.Column("rpm", sa.Integer(), nullable=True),
        sa.Column("tpm", sa.Integer(), nullable=True),
        sa.Column("concurrency", sa.Integer(), nullable=True),
        sa.Column("monthly_budget_micros", sa.BigInteger(), nullable=True),
        sa.Column("updated_at", _TS, server_default=sa.func.now(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_quotas"),
        sa.ForeignKeyConstraint(
            ["api_key_id"], ["api_keys.id"], name="fk_quotas_api_key_id_api_keys",
            ondelete="CASCADE",
        ),
        sa.UniqueConstraint(
            "tenant_id", "api_key_id", name="uq_quotas_tenant_id", postgresql_nulls_not_distinct=True
        ),
    )
    op.create_table(
        "quota_counters",
        sa.Column("subject", sa.String(80), nullable=False),
        sa.Column("window_start", _TS, nullable=False),
        sa.Column("requests", sa.Integer(), server_default="0", nullable=False),
        sa.Column("tokens", sa.BigInteger(), server_default="0", nullable=False),
        sa.PrimaryKeyConstraint("subject", "window_start", name="pk_quota_counters"),
    )
    op.create_table(
        "quota_leases",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("subject", sa.String(80), nullable=False),
        sa.Column("expires_at", _TS, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_quota_leases"),
    )
    op.create_index("ix_quota_leases_subject", "quota_leases", ["subject"])
    op.create_table(
        "budget_spend",
        sa.Column("tenant_id", sa.Uuid(), nullable=False),
        sa.Column("month", sa.Date(), nullable=False),
        sa.Column("spent_micros", sa.BigInteger(), server_default="0", nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "month", name="pk_budget_spend"),
    )
    op.create_table(
        "audit_log",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("created_at", _TS, server_default=sa.func.now(), nullable=False),
        sa.Column("actor", sa.String(200), nullable=False),
        sa.Column("actor_role", sa.String(32), nullable=False),
        sa.Column("tenant_id", sa.Uuid(), nullable=True),  # no FK: the log outlives tenants
        sa.Column("action", sa.String(64), nullable=False),
        sa.Column("target_type", sa.String(32), nullable=False),
        sa.Column("target_id", sa.String(64), nullable=False),
        sa.Column("before", postgresql.JSONB(), nullable=True),
        sa.Column("after", postgresql.JSONB(), nullable=True),
        sa.Column("request_id", sa.String(64), nullable=True),
        sa.Column("source", sa.String(64), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_audit_log"),
    )
    op.create_index("ix_audit_log_tenant_id", "audit_log", ["tenant_id", "id"])
    op.create_index("ix_audit_log_request_id", "audit_log", ["request_id"])
    op.execute(
        """
        CREATE FUNCTION audit_log_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'audit_log is append-only'; END $$
        """
    )
    op.execute(
        """
        CREATE TRIGGER audit_log_append_only BEFORE UPDATE OR DELETE OR TRUNCATE ON audit_log
            FOR EACH STATEMENT EXECUTE FUNCTION audit_log_append_only()
        """
    )
    op.create_table(
        "oauth_clients",
        sa.Column("id", sa.Uuid(), nullable=False),
        *_tenant_fk("oauth_clients"),
        sa.Column("client_id", sa.String(64), nullable=False),
        sa.Column("secret_digest", sa.LargeBinary(32), nullable=False),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("scopes", postgresql.ARRAY(sa.String(32)), nullable=False),
        sa.Column("created_at", _TS, server_default=sa.func.now(), nullable=False),
        sa.Column("revoked_at", _TS, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_oauth_clients"),
        sa.UniqueConstraint("client_id", name="uq_oauth_clients_client_id"),
    )
    op.create_table(
        "oauth_signing_keys",
        sa.Column("kid", sa.String(64), nullable=False),
        sa.Column("private_pem", sa.Text(), nullable=False),
        sa.Column("created_at", _TS, server_default=sa.func.now(), nullable=False),
        sa.Column("retired_at", _TS, nullable=True),
        sa.PrimaryKeyConstraint("kid", name="pk_oauth_signing_keys"),
    )
    op.create_table(
        "oauth_revoked_tokens",
        sa.Column("jti", sa.String(64), nullable=False),
        sa.Column("expires_at", _TS, nullable=False),
        sa.PrimaryKeyConstraint("jti", name="pk_oauth_revoked_tokens"),
    )
    _row_level_security()


def _row_level_security() -> None:
    """A second wall: as ``kiln_tenant`` a session sees only the rows of ``kiln.tenant_id``."""
    op.execute(
        f"""
        DO $$ BEGIN
            IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{APP_ROLE}') THEN
                CREATE ROLE {APP_ROLE} NOLOGIN;
            END IF;
        END $$;
        """
    )
    for table, column in TENANT_TABLES.items():
        op.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
        op.execute(
            f"CREATE POLICY tenant_isolation ON {table} TO {APP_ROLE} USING "
            f"({column} = NULLIF(current_setting('kiln.tenant_id', true), '')::uuid)"
        )
        op.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON {table} TO {APP_ROLE}")
    op.execute(f"GRANT USAGE ON SEQUENCE audit_log_id_seq TO {APP_ROLE}")
    op.execute(f"GRANT {APP_ROLE} TO current_user")  # lets the app `SET LOCAL ROLE` to it


def downgrade() -> None:
    for table in TENANT_TABLES:
        op.execute(f"DROP POLICY IF EXISTS tenant_isolation ON {table}")
        op.execute(f"REVOKE ALL ON {table} FROM {APP_ROLE}")
        op.execute(f"ALTER TABLE {table} DISABLE ROW LEVEL SECURITY")
    op.execute(f"REVOKE ALL ON SEQUENCE audit_log_id_seq FROM {APP_ROLE}")
    for table in (
        "oauth_revoked_tokens", "oauth_signing_keys", "oauth_clients", "audit_log",
        "budget_spend", "quota_leases", "quota_counters", "quotas", "users",
    ):  # fmt: skip
        op.drop_table(table)
    op.execute("DROP FUNCTION IF EXISTS audit_log_append_only()")
    op.drop_constraint("ck_api_keys_role", "api_keys")
    op.drop_column("api_keys", "role")
