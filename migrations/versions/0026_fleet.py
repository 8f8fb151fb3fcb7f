"""Many gateways, one fleet (issue 21): the gateway registry, the workers the pool manager's
leader registered for every gateway, and each pool's size as the leader applied it.

Deployment state, not tenant data: no tenant column, so no row-level security (as
``model_shadows``); the app role reads and writes them (0010's default privileges, granted
again here so the migration stands alone).

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None

APP = "kiln_app"
_TZ = sa.DateTime(timezone=True)
_TABLES = ("fleet_gateways", "fleet_replicas", "fleet_pools")


def _now(name: str) -> sa.Column[object]:
    return sa.Column(name, _TZ, server_default=sa.func.now(), nullable=False)


def upgrade() -> None:
    op.create_table(
        "fleet_gateways",
        sa.Column("id", sa.Uuid(), primary_key=True),
        sa.Column("host", sa.String(200), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("leader", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("wishes", postgresql.JSONB(), server_default="{}", nullable=False),
        _now("started_at"),
        _now("heartbeat_at"),
    )
    op.create_table(
        "fleet_replicas",
        sa.Column("url", sa.String(300), primary_key=True),
        sa.Column("pool", sa.String(300), nullable=False, index=True),
        sa.Column("gateway_id", sa.Uuid(), nullable=False),
        sa.Column("task", sa.String(32), nullable=False),
        sa.Column("slots", sa.Integer(), nullable=False),
        sa.Column("max_batch_size", sa.Integer(), nullable=False),
        sa.Column("max_queue", sa.Integer(), nullable=False),
        _now("heartbeat_at"),
    )
    op.create_table(
        "fleet_pools",
        sa.Column("pool", sa.String(300), primary_key=True),
        sa.Column("desired", sa.Integer(), nullable=False),
        sa.Column("gateway_id", sa.Uuid(), nullable=False),
        _now("updated_at"),
    )
    for table in _TABLES:
        op.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON {table} TO {APP}")


def downgrade() -> None:
    for table in reversed(_TABLES):
        op.drop_table(table)
