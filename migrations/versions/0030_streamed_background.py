"""Streamed background responses (``background`` and ``stream`` on ``/v1/responses``): a
response's events, sealed, kept with it once its run ends, so ``GET /v1/responses/{id}?stream=
true&starting_after=N`` resumes its stream on any gateway; empty while it runs, null for a
response that was not streamed.

Revision ID: 0030
Revises: 0029
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0030"
down_revision = "0029"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("responses", sa.Column("events", sa.LargeBinary()))


def downgrade() -> None:
    op.drop_column("responses", "events")
