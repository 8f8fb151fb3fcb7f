"""Console session security: a session version per user (signing out, or a password, role or
tenant change, signs every session out) and the SSO identity a user is bound to.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

# Any change of the password, role or tenant bumps the version, whichever code path (or SQL)
# makes it: sessions signed with the old version are then signed out.
_FUNCTION = """
CREATE FUNCTION users_bump_session_version() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.password_hash IS DISTINCT FROM OLD.password_hash
       OR NEW.role IS DISTINCT FROM OLD.role
       OR NEW.tenant_id IS DISTINCT FROM OLD.tenant_id THEN
        NEW.session_version := OLD.session_version + 1;
    END IF;
    RETURN NEW;
END $$
"""
_TRIGGER = """
CREATE TRIGGER users_session_version BEFORE UPDATE ON users
    FOR EACH ROW EXECUTE FUNCTION users_bump_session_version()
"""


def upgrade() -> None:
    op.add_column(
        "users",
        sa.Column("session_version", sa.Integer(), server_default="0", nullable=False),
    )
    op.add_column("users", sa.Column("oidc_issuer", sa.String(400), nullable=True))
    op.add_column("users", sa.Column("oidc_subject", sa.String(400), nullable=True))
    op.create_unique_constraint(
        "uq_users_oidc_issuer_subject", "users", ["oidc_issuer", "oidc_subject"]
    )
    op.execute(_FUNCTION)
    op.execute(_TRIGGER)


def downgrade() -> None:
    op.execute("DROP TRIGGER users_session_version ON users")
    op.execute("DROP FUNCTION users_bump_session_version()")
    op.drop_constraint("uq_users_oidc_issuer_subject", "users")
    op.drop_column("users", "oidc_subject")
    op.drop_column("users", "oidc_issuer")
    op.drop_column("users", "session_version")
