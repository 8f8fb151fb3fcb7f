"""Safe releases: per-model aliases, operators' tenant pins, version lifecycle and lineage.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

_TZ = sa.DateTime(timezone=True)
_LINEAGE = ("parent_version", "imported_by")


def upgrade() -> None:
    op.create_table(
        "model_aliases",
        sa.Column(
            "model_id", sa.Uuid(), sa.ForeignKey("models.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("alias", sa.String(64), primary_key=True),
        sa.Column("version", sa.String(64), nullable=False),
        sa.Column("updated_at", _TZ, server_default=sa.func.now(), nullable=False),
    )  # fmt: skip
    op.create_table(
        "model_pins",
        sa.Column(
            "model_id", sa.Uuid(), sa.ForeignKey("models.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column(
            "tenant_id", sa.Uuid(), sa.ForeignKey("tenants.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("target", sa.String(64), nullable=False),
        sa.Column("updated_at", _TZ, server_default=sa.func.now(), nullable=False),
    )  # fmt: skip
    op.add_column(
        "model_versions",
        sa.Column("state", sa.String(16), server_default="active", nullable=False),
    )
    op.add_column("model_versions", sa.Column("deprecated_at", _TZ))
    op.add_column("model_versions", sa.Column("sunset", _TZ))
    op.add_column("model_versions", sa.Column("successor", sa.String(64)))
    for name in _LINEAGE:
        op.add_column("model_versions", sa.Column(name, sa.String(200)))
    op.add_column(
        "model_versions",
        sa.Column("metadata", postgresql.JSONB(), server_default="{}", nullable=False),
    )
    op.execute("GRANT SELECT ON model_aliases TO kiln_tenant")


def downgrade() -> None:
    for name in ("metadata", *_LINEAGE, "successor", "sunset", "deprecated_at", "state"):
        op.drop_column("model_versions", name)
    op.drop_table("model_pins")
    op.drop_table("model_aliases")
