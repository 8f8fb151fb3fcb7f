"""Background responses (``background: true`` on ``/v1/responses``): a stored response has a
``status`` in the clear (``queued``, ``in_progress``, then ``completed``, ``incomplete``,
``failed`` or ``cancelled``), so a cancel and the running task's last write settle in one
conditional update; and ``lease_until``, renewed by the gateway that runs it, so a response
whose gateway died reads as failed instead of in progress for ever.

Revision ID: 0029
Revises: 0028
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0029"
down_revision = "0028"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "responses",
        sa.Column("status", sa.String(16), server_default="completed", nullable=False),
    )
    op.add_column("responses", sa.Column("lease_until", sa.DateTime(timezone=True)))


def downgrade() -> None:
    op.drop_column("responses", "lease_until")
    op.drop_column("responses", "status")
