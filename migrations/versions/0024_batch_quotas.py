"""Batch quotas: two limits of their own (tokens per tenant-local day, estimated tokens
enqueued) and the estimated tokens of each file and batch they are checked against.

The daily count lives in ``quota_counters`` (a row per subject and day); no new table.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None

LIMITS = ("batch_tokens_per_day", "batch_enqueued_tokens")
ESTIMATED = ("files", "batches")


def upgrade() -> None:
    for name in LIMITS:
        op.add_column("quotas", sa.Column(name, sa.BigInteger()))
    for table in ESTIMATED:  # files uploaded before: 0 (they fit any batch quota)
        op.add_column(table, sa.Column("estimated_tokens", sa.BigInteger(), nullable=False,
                                       server_default="0"))  # fmt: skip


def downgrade() -> None:
    for table in ESTIMATED:
        op.drop_column(table, "estimated_tokens")
    for name in LIMITS:
        op.drop_column("quotas", name)
