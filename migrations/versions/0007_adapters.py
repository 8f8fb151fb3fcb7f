"""LoRA adapters: a tenant's PEFT adapters of generation models (row-level security by tenant).

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

APP_ROLE = "kiln_tenant"


def upgrade() -> None:
    op.create_table(
        "adapters",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("tenant_id", sa.Uuid(), nullable=False),
        sa.Column("model_id", sa.Uuid(), nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("digest", sa.String(71), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("modules", postgresql.ARRAY(sa.String(16)), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("id", name="pk_adapters"),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name="fk_adapters_tenant_id_tenants", ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["model_id"], ["models.id"], name="fk_adapters_model_id_models", ondelete="CASCADE"
        ),
        sa.UniqueConstraint("tenant_id", "model_id", "name", name="uq_adapters_tenant_id"),
    )
    op.execute("ALTER TABLE adapters ENABLE ROW LEVEL SECURITY")
    op.execute(
        f"CREATE POLICY tenant_isolation ON adapters TO {APP_ROLE} USING "
        "(tenant_id = NULLIF(current_setting('kiln.tenant_id', true), '')::uuid)"
    )
    op.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON adapters TO {APP_ROLE}")


def downgrade() -> None:
    op.execute("DROP POLICY IF EXISTS tenant_isolation ON adapters")
    op.execute(f"REVOKE ALL ON adapters FROM {APP_ROLE}")
    op.drop_table("adapters")
