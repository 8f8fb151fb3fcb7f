"""Bring your own model: build jobs beside compile jobs, and what a version carries.

``compile_jobs`` also holds *build* jobs (``kind = 'build'``): a source in the artifact store
built into a served folder by ``python -m kiln_runtimes.build``. A build job has no version until
it succeeds (``model_version_id`` becomes nullable; ``model_name`` and ``version_name`` say what
it will register), reports its ``phase`` and ``percent`` while it runs, and on bad input the
``error_file`` / ``error_field`` the build named. ``model_versions`` gains ``engine_settings``
(target, precision, max batch size, max context, adapter slots: per version, not global),
``accuracy`` (the build's report) and ``source_digest`` (the source tree it was built from).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "compile_jobs",
        sa.Column("kind", sa.String(16), server_default="compile", nullable=False),
    )
    op.create_check_constraint(op.f("ck_compile_jobs_kind"), "compile_jobs", "kind IN ('compile', 'build')")
    op.alter_column("compile_jobs", "model_version_id", nullable=True)
    op.create_check_constraint(
        op.f("ck_compile_jobs_version_or_build"), "compile_jobs", "kind = 'build' OR model_version_id IS NOT NULL"
    )
    for column in (
        sa.Column("model_name", sa.String(200), nullable=True),
        sa.Column("version_name", sa.String(64), nullable=True),
        sa.Column("task", sa.String(20), nullable=True),
        sa.Column("source_digest", sa.String(71), nullable=True),
        sa.Column("engine_settings", postgresql.JSONB(), nullable=True),
        sa.Column("phase", sa.String(32), nullable=True),
        sa.Column("percent", sa.SmallInteger(), server_default="0", nullable=False),
        sa.Column("error_file", sa.Text(), nullable=True),
        sa.Column("error_field", sa.Text(), nullable=True),
    ):
        op.add_column("compile_jobs", column)
    for column in (
        sa.Column("engine_settings", postgresql.JSONB(), server_default="{}", nullable=False),
        sa.Column("accuracy", postgresql.JSONB(), nullable=True),
        sa.Column("source_digest", sa.String(71), nullable=True),
    ):
        op.add_column("model_versions", column)


def downgrade() -> None:
    for name in ("source_digest", "accuracy", "engine_settings"):
        op.drop_column("model_versions", name)
    op.execute("DELETE FROM compile_jobs WHERE kind = 'build'")
    op.drop_constraint("ck_compile_jobs_version_or_build", "compile_jobs", type_="check")
    op.drop_constraint("ck_compile_jobs_kind", "compile_jobs", type_="check")
    for name in ("error_field", "error_file", "percent", "phase", "engine_settings",
                 "source_digest", "task", "version_name", "model_name", "kind"):  # fmt: skip
        op.drop_column("compile_jobs", name)
    op.alter_column("compile_jobs", "model_version_id", nullable=False)
