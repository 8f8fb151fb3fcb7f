"""The app's database: migrated by the owner, used as the app's role."""

from __future__ import annotations

from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kiln_platform.db import migrate
from kiln_platform.db.engine import create_engine, database_urls, sessionmaker

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

    from kiln_platform.db.credentials import PasswordSource
    from kiln_platform.settings import Settings


@dataclass(frozen=True, slots=True)
class Database:
    """The app's engine (role ``kiln_app``) and its session factory for platform work."""

    engine: AsyncEngine
    sessions: async_sessionmaker[AsyncSession]
    """Sessions that declare platform scope (``db.engine.PlatformSession``)."""
    set_role: str | None = None
    """The role each connection switches to (no owner URL configured), for more engines."""
    password: PasswordSource | None = None
    """The app's password source (``db.credentials``), for more engines."""


@asynccontextmanager
async def open_database(settings: Settings, *, upgrade: bool = True) -> AsyncIterator[Database]:
    """Apply migrations as the owner (starting the embedded server if needed), then connect as
    the app's role; refuse a role that would lift row-level security."""
    with database_urls(settings) as urls:
        if upgrade:
            owner = create_engine(
                urls.owner,
                pool_size=1,
                connect_timeout_s=settings.db_connect_timeout_s,
                password=urls.owner_credentials,
            )
            try:
                await migrate.upgrade(owner, settings.hmac_key(), app_password=urls.app_password)
            finally:
                await owner.dispose()
        engine = create_engine(
            urls.app,
            role=urls.set_role,
            connect_timeout_s=settings.db_connect_timeout_s,
            password=urls.app_credentials,
        )
        try:
            await migrate.check_app_role(engine)
            yield Database(engine, sessionmaker(engine), urls.set_role, urls.app_credentials)
        finally:
            await engine.dispose()
