"""OpenAI-compatible Files and Batches: tenants' files (bytes in the artifact store), batches
and each batch line's result (row-level security by tenant, as on every tenant table).

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

APP = "kiln_app"
TENANT = "kiln_tenant"
TENANT_MATCH = "tenant_id = NULLIF(current_setting('kiln.tenant_id', true), '')::uuid"
PLATFORM = "current_setting('kiln.scope', true) = 'platform'"
_TZ = sa.DateTime(timezone=True)
_TABLES = ("files", "batches", "batch_lines")


def _tenant() -> sa.Column[object]:
    return sa.Column(
        "tenant_id", sa.Uuid(), sa.ForeignKey("tenants.id", ondelete="CASCADE"), nullable=False
    )


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
        "files",
        sa.Column("id", sa.Uuid(), primary_key=True),
        _tenant(),
        sa.Column("filename", sa.String(255), nullable=False),
        sa.Column("purpose", sa.String(32), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("lines", sa.Integer(), nullable=False),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("created_at", _TZ, server_default=sa.func.now(), nullable=False),
    )
    op.create_index("ix_files_tenant_id", "files", ["tenant_id", "created_at"])
    op.create_table(
        "batches",
        sa.Column("id", sa.Uuid(), primary_key=True),
        _tenant(),
        sa.Column("endpoint", sa.String(64), nullable=False),
        sa.Column("input_file_id", sa.Uuid(), sa.ForeignKey("files.id", ondelete="SET NULL")),
        sa.Column("completion_window", sa.String(8), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("metadata", postgresql.JSONB(), nullable=True),
        sa.Column("principal", postgresql.JSONB(), nullable=False),
        sa.Column("errors", postgresql.JSONB(), nullable=True),
        sa.Column("output_file_id", sa.Uuid(), sa.ForeignKey("files.id", ondelete="SET NULL")),
        sa.Column("error_file_id", sa.Uuid(), sa.ForeignKey("files.id", ondelete="SET NULL")),
        sa.Column("total", sa.Integer(), server_default="0", nullable=False),
        sa.Column("created_at", _TZ, server_default=sa.func.now(), nullable=False),
        sa.Column("expires_at", _TZ, nullable=False),
        *(sa.Column(f"{s}_at", _TZ) for s in ("in_progress", "finalizing", "completed",
                                                "failed", "expired", "cancelling", "cancelled")),
        sa.Column("lease_owner", sa.String(64)),
        sa.Column("lease_until", _TZ),
    )  # fmt: skip
    op.create_index("ix_batches_tenant_id", "batches", ["tenant_id", "created_at"])
    op.create_index(
        "ix_batches_open", "batches", ["created_at"],
        postgresql_where=sa.text("status IN ('validating', 'in_progress', 'finalizing', "
                                 "'cancelling')"),
    )  # fmt: skip
    op.create_table(
        "batch_lines",
        sa.Column(
            "batch_id", sa.Uuid(), sa.ForeignKey("batches.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("custom_id", sa.String(512), primary_key=True),
        _tenant(),
        sa.Column("line", sa.Integer(), nullable=False),
        sa.Column("ok", sa.Boolean(), nullable=False),
        sa.Column("output", sa.Text(), nullable=False),
        sa.Column("created_at", _TZ, server_default=sa.func.now(), nullable=False),
    )  # fmt: skip
    for table in _TABLES:
        _isolate(table)


def downgrade() -> None:
    for table in reversed(_TABLES):
        op.drop_table(table)
