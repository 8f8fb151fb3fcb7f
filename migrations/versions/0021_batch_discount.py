"""The price book's batch discount: Batches API lines cost this much less than online requests.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "price_books",
        sa.Column("batch_discount_bps", sa.Integer(), server_default="0", nullable=False),
    )
    op.create_check_constraint(
        "price_books_batch_discount_bps", "price_books",
        "batch_discount_bps BETWEEN 0 AND 10000",
    )  # fmt: skip


def downgrade() -> None:
    op.drop_column("price_books", "batch_discount_bps")
