"""Files by their bytes' digest: a deleted or expired file's bytes are removed once no file
(any tenant's) names them, which each deletion and each prune asks digest by digest.

Revision ID: 0035
Revises: 0034
Create Date: 2026-12-06
"""

from __future__ import annotations

from alembic import op

revision = "0035"
down_revision = "0034"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_files_digest", "files", ["digest"])


def downgrade() -> None:
    op.drop_index("ix_files_digest", table_name="files")
