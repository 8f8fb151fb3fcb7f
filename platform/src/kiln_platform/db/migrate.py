"""Apply Alembic migrations programmatically, serialized across processes by an advisory lock."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import text

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection
    from sqlalchemy.ext.asyncio import AsyncEngine

_LOCK_ID = 0x6B696C6E  # "kiln"


def migrations_dir() -> Path:
    """The packaged copy of ``migrations/`` in a wheel, else the repository's."""
    packaged = Path(__file__).resolve().parent.parent / "_migrations"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[4] / "migrations"


def _config(connection: Connection | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    cfg.attributes["connection"] = connection
    return cfg


def head_revision() -> str | None:
    """The newest revision in the migration scripts."""
    return ScriptDirectory.from_config(_config()).get_current_head()


def current_revision(connection: Connection) -> str | None:
    """The revision the database is at."""
    return MigrationContext.configure(connection).get_current_revision()


def _upgrade(connection: Connection) -> None:
    connection.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": _LOCK_ID})
    command.upgrade(_config(connection), "head")


async def upgrade(engine: AsyncEngine) -> None:
    """Bring the database to the head revision (idempotent, safe from several processes)."""
    async with engine.begin() as conn:
        await conn.run_sync(_upgrade)


async def is_current(engine: AsyncEngine) -> bool:
    """Whether the database is reachable and at the head revision."""
    async with engine.connect() as conn:
        return await conn.run_sync(current_revision) == head_revision()
