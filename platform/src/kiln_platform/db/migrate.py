"""Apply Alembic migrations programmatically, serialized across processes by an advisory lock."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import text

from kiln_platform.db.engine import APP_ROLE

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection
    from sqlalchemy.ext.asyncio import AsyncEngine

_LOCK_ID = 0x6B696C6E  # "kiln"
_VERSION = text("SELECT version_num FROM alembic_version")


def migrations_dir() -> Path:
    """The packaged copy of ``migrations/`` in a wheel, else the repository's."""
    packaged = Path(__file__).resolve().parent.parent / "_migrations"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[4] / "migrations"


def _config(connection: Connection | None = None, secret: bytes | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    cfg.attributes["connection"] = connection
    cfg.attributes["secret"] = secret  # data migrations that seal secrets at rest (0010)
    return cfg


@functools.cache
def head_revision() -> str | None:
    """The newest revision in the migration scripts (read once: they do not change under a
    running process, and reading them loads every script: readiness probes, every few
    seconds, did that each time)."""
    return ScriptDirectory.from_config(_config()).get_current_head()


def _upgrade(
    connection: Connection, secret: bytes | None, app_password: str | None, revision: str
) -> None:
    connection.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": _LOCK_ID})
    if revision != "head" or _version(connection) != head_revision():
        command.upgrade(_config(connection, secret), revision)
    if app_password is not None:  # hex: nothing to escape; DDL takes no bind parameters
        connection.execute(text(f"ALTER ROLE {APP_ROLE} WITH LOGIN PASSWORD '{app_password}'"))


def _version(connection: Connection) -> str | None:
    """The database's revision, or None before the first migration. Checked before alembic runs:
    its environment loads every table module and script, ~0.2 s that each ``kiln`` command and
    process start paid though the database was nearly always current already."""
    if connection.scalar(text("SELECT to_regclass('alembic_version')")) is None:
        return None
    return connection.scalar(_VERSION)  # type: ignore[no-any-return]


async def upgrade(
    engine: AsyncEngine,
    secret: bytes | None = None,
    *,
    app_password: str | None = None,
    revision: str = "head",
) -> None:
    """Bring the database to the head revision (idempotent, safe from several processes).

    ``engine`` connects as the tables' owner; ``secret`` is the server secret (a migration that
    seals plaintext secrets needs it); ``app_password`` lets ``kiln_app`` log in with it (the
    embedded server); ``revision`` is for tests of a data migration.
    """
    async with engine.begin() as conn:
        await conn.run_sync(_upgrade, secret, app_password, revision)


async def is_current(engine: AsyncEngine) -> bool:
    """Whether the database is reachable and at the head revision (raises if it is not
    reachable, or not migrated at all). One cached statement: alembic's ``MigrationContext``
    builds a new table object per call, each compiled anew into the engine's statement cache."""
    async with engine.connect() as conn:
        return bool(await conn.scalar(_VERSION) == head_revision())


class UnsafeDatabaseRole(RuntimeError):
    """The app's database role would lift row-level security (superuser, BYPASSRLS, owner)."""


_ROLE_CHECK = text(
    """
    SELECT current_user, r.rolsuper OR r.rolbypassrls,
           EXISTS (SELECT FROM pg_tables t
                   WHERE t.schemaname = current_schema() AND t.tableowner = current_user)
    FROM pg_roles r WHERE r.rolname = current_user
    """
)


async def check_app_role(engine: AsyncEngine) -> None:
    """Refuse to serve as a role that row-level security does not bind."""
    async with engine.connect() as conn:
        row = (await conn.execute(_ROLE_CHECK)).one()
    user, privileged, owner = row
    if privileged or owner:
        raise UnsafeDatabaseRole(
            f"the app's database role {user!r} is a superuser, bypasses row-level security or "
            "owns Kiln's tables: set KILN_DATABASE_OWNER_URL to the owner and KILN_DATABASE_URL "
            "to a login role that is a member of kiln_app (docs/security.md)"
        )
