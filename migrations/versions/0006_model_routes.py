"""Model routes: the stable version each model serves, and an optional canary with its share.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

APP_ROLE = "kiln_tenant"


def upgrade() -> None:
    op.create_table(
        "model_routes",
        sa.Column("model_id", sa.Uuid(), nullable=False),
        sa.Column("stable_version", sa.String(64), nullable=False),
        sa.Column("canary_version", sa.String(64), nullable=True),
        sa.Column("canary_percent", sa.SmallInteger(), server_default="0", nullable=False),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("model_id", name="pk_model_routes"),
        sa.ForeignKeyConstraint(
            ["model_id"], ["models.id"], name="fk_model_routes_model_id_models", ondelete="CASCADE"
        ),
        sa.CheckConstraint(
            "canary_percent BETWEEN 0 AND 100", name="ck_model_routes_canary_percent_range"
        ),
        sa.CheckConstraint(
            "canary_version IS NOT NULL OR canary_percent = 0",
            name="ck_model_routes_canary_needs_version",
        ),
    )
    # The model catalog is not tenant data: tenant-confined admin sessions may read it.
    for table in ("models", "model_versions", "model_routes"):
        op.execute(f"GRANT SELECT ON {table} TO {APP_ROLE}")


def downgrade() -> None:
    for table in ("models", "model_versions"):
        op.execute(f"REVOKE SELECT ON {table} FROM {APP_ROLE}")
    op.drop_table("model_routes")
