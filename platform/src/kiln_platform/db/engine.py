"""Database URL resolution (embedded PostgreSQL when none is configured) and the async engine."""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from sqlalchemy.ext.asyncio import AsyncSession

    from kiln_platform.settings import Settings


@contextmanager
def embedded_server(pg_dir: Path) -> Iterator[str]:
    """Start (or attach to) the embedded PostgreSQL in ``pg_dir``; yields a libpq URI.

    pgserver reference-counts the processes attached to one data directory, so ``kiln up`` and
    admin commands run beside it share one server; the last process to leave stops it.
    """
    with warnings.catch_warnings():  # its lock dir falls back to /tmp without XDG_RUNTIME_DIR
        warnings.simplefilter("ignore")
        import pgserver

        pg_dir.mkdir(parents=True, exist_ok=True)
        server = pgserver.get_server(pg_dir, cleanup_mode="stop")  # type: ignore[attr-defined]
    try:
        yield str(server.get_uri())
    finally:
        server.cleanup()


def asyncpg_url(uri: str) -> str:
    """Turn a ``postgresql://`` URI into SQLAlchemy's asyncpg form."""
    scheme = urlsplit(uri).scheme
    if scheme in ("postgresql", "postgres"):
        return "postgresql+asyncpg" + uri[len(scheme) :]
    return uri


@contextmanager
def database_url(settings: Settings) -> Iterator[str]:
    """The configured database URL, or the embedded server's while it is held."""
    if settings.database_url:
        yield asyncpg_url(settings.database_url)
        return
    with embedded_server(settings.pg_dir) as uri:
        yield asyncpg_url(uri)


def create_engine(url: str, pool_size: int = 10, *, pre_ping: bool = True) -> AsyncEngine:
    """An asyncpg-backed engine; UTC sessions."""
    return create_async_engine(
        url,
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_pre_ping=pre_ping,
        connect_args={"server_settings": {"timezone": "UTC", "application_name": "kiln"}},
    )


def writer_engine(engine: AsyncEngine) -> AsyncEngine:
    """One connection to ``engine``'s database for a single busy writer (the usage ledger).

    No ping before each use: the writer retries a failed batch, and a dead connection is
    replaced then; the ping would cost a round trip per batch.
    """
    return create_engine(engine.url.render_as_string(hide_password=False), 1, pre_ping=False)


def sessionmaker(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    """Session factory; objects stay usable after commit."""
    return async_sessionmaker(engine, expire_on_commit=False)
