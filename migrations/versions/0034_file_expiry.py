"""Files that expire (OpenAI's ``expires_after`` on upload, a batch's ``output_expires_after``):
``files.expires_at`` (null: kept until deleted), indexed for the prune that deletes them, and
the seconds a batch's output and error files are kept, ``batches.output_expires_s``.

Revision ID: 0034
Revises: 0033
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0034"
down_revision = "0033"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("files", sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("batches", sa.Column("output_expires_s", sa.Integer(), nullable=True))
    op.create_index(
        "ix_files_expires_at", "files", ["expires_at"],
        postgresql_where=sa.text("expires_at IS NOT NULL"),
    )  # fmt: skip


def downgrade() -> None:
    op.drop_index("ix_files_expires_at", table_name="files")
    op.drop_column("batches", "output_expires_s")
    op.drop_column("files", "expires_at")
