"""Database URL resolution (embedded PostgreSQL when none is configured), the async engine, and
the session factory for platform work.

Two roles: the owner of the tables applies migrations; the app connects as ``kiln_app``, which
owns nothing and does not bypass row-level security (RLS is forced on every tenant table, so it
binds even the owner). A transaction sees tenant rows only if it declares whose: ``kiln.tenant_id``
for one tenant, or ``kiln.scope = 'platform'`` for platform work (the session factory below).
"""

from __future__ import annotations

import asyncio
import warnings
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from sqlalchemy import event, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import (
    AsyncConnection,
    AsyncEngine,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.orm import Session
from sqlalchemy.pool import QueuePool

from kiln_platform.db.credentials import PasswordSource, password_sources
from kiln_platform.sealing import derive
from kiln_platform.settings import CONNECT_TIMEOUT_S, Settings

if TYPE_CHECKING:
    import uuid
    from collections.abc import AsyncIterator, Iterator
    from pathlib import Path

    from sqlalchemy.engine import Connection
    from sqlalchemy.ext.asyncio import AsyncSession
    from sqlalchemy.orm import SessionTransaction


APP_ROLE = "kiln_app"
"""The role the app works as: no ownership, no DDL, no ``BYPASSRLS`` (migration ``0010``)."""
PLATFORM_SCOPE = "SELECT set_config('kiln.scope', 'platform', true)"
TENANT_ROLE = "kiln_tenant"
"""The role of tenant-confined transactions (``SET LOCAL ROLE``): no platform-scope policy."""
TENANT_CONTEXT = text(
    "SELECT set_config('kiln.tenant_id', :t, true), set_config('kiln.scope', '', true)"
)
"""One tenant's context, the platform scope the session factory declared withdrawn."""


async def confine(session: AsyncSession, tenant_id: uuid.UUID) -> None:
    """Confine the session's transaction to one tenant: ``kiln_tenant`` with ``kiln.tenant_id``
    set sees and writes only that tenant's rows, even from a query that forgot its filter."""
    await session.execute(text(f"SET LOCAL ROLE {TENANT_ROLE}"))
    await session.execute(TENANT_CONTEXT, {"t": str(tenant_id)})


@asynccontextmanager
async def tenant_transaction(
    sessions: async_sessionmaker[AsyncSession], tenant_id: uuid.UUID
) -> AsyncIterator[AsyncSession]:
    """A transaction confined to one tenant (``confine``): row-level security's second wall."""
    async with sessions.begin() as session:
        await confine(session, tenant_id)
        yield session


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


@dataclass(frozen=True, slots=True)
class Urls:
    """Where Kiln connects (asyncpg URLs)."""

    owner: str
    """The tables' owner: migrations only."""
    app: str
    """The app's connections."""
    set_role: str | None = None
    """Role each app connection switches to at connect (no owner URL: the weaker fallback)."""
    app_password: str | None = None
    """Password migrations give ``kiln_app`` (the embedded server, whose app URL logs in as it)."""
    app_credentials: PasswordSource | None = None
    """Asked for the app's password at each new connection (``db.credentials``)."""
    owner_credentials: PasswordSource | None = None
    """Asked for the owner's password at each new connection."""


def app_password(secret: bytes) -> str:
    """``kiln_app``'s password on the embedded server, derived from the server secret."""
    return derive(secret, b"kiln embedded database app role v1").hex()


@contextmanager
def database_urls(settings: Settings) -> Iterator[Urls]:
    """The configured database's URLs, or the embedded server's while it is held."""
    if settings.database_url:
        app = asyncpg_url(settings.database_url)
        owner = settings.database_owner_url
        app_source, owner_source = password_sources(settings, app, owner)
        yield Urls(
            owner=asyncpg_url(owner) if owner else app,
            app=app,
            set_role=None if owner else APP_ROLE,
            app_credentials=app_source,
            owner_credentials=owner_source,
        )
        return
    with embedded_server(settings.pg_dir) as uri:
        owner = asyncpg_url(uri)
        password = app_password(settings.hmac_key())
        app_url = make_url(owner).set(username=APP_ROLE, password=password)
        yield Urls(owner, app_url.render_as_string(hide_password=False), app_password=password)


def create_engine(
    url: str,
    pool_size: int = 10,
    *,
    pre_ping: bool = True,
    role: str | None = None,
    connect_timeout_s: float = CONNECT_TIMEOUT_S,
    password: PasswordSource | None = None,
    synchronous_commit: bool = True,
    platform_scope: bool = False,
) -> AsyncEngine:
    """An asyncpg-backed engine; UTC sessions; each connection as ``role`` if given (sent in
    the start-up packet, so no round trip); a connection attempt gives up after
    ``connect_timeout_s`` (``TimeoutError``, which ``db.outage.unreachable`` recognizes);
    ``password`` (if given) is called for each new connection's password, over the URL's;
    ``synchronous_commit=False``: a commit returns before its WAL reaches the disk;
    ``platform_scope``: every transaction on its connections is platform-scoped (``kiln.scope``
    in the start-up packet, for ``writer_sessions``)."""
    server_settings = {"timezone": "UTC", "application_name": "kiln"}
    if role is not None:
        server_settings["role"] = role
    if not synchronous_commit:
        server_settings["synchronous_commit"] = "off"
    if platform_scope:
        server_settings["kiln.scope"] = "platform"
    connect_args: dict[str, Any] = {"server_settings": server_settings}
    connect_args["timeout"] = connect_timeout_s
    if password is not None:
        connect_args["password"] = password  # asyncpg calls it at every connect
    return create_async_engine(
        url,
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_pre_ping=pre_ping,
        connect_args=connect_args,
    )


async def fill(engine: AsyncEngine) -> None:
    """Open ``engine``'s pool to its ``pool_size`` now: serving starts with every connection the
    pool keeps, so no early request pays a connection's set-up and the count stays flat; those
    a burst opens past the size (its overflow) close as they are returned."""
    pool = engine.sync_engine.pool
    size = pool.size() if isinstance(pool, QueuePool) else 0
    opened = await asyncio.gather(
        *(engine.connect().start() for _ in range(size)), return_exceptions=True
    )
    for conn in opened:
        if isinstance(conn, AsyncConnection):
            await conn.close()  # back to the pool, kept open
    for failed in opened:
        if isinstance(failed, BaseException):
            raise failed


def writer_engine(
    engine: AsyncEngine,
    role: str | None = None,
    connect_timeout_s: float = CONNECT_TIMEOUT_S,
    password: PasswordSource | None = None,
    *,
    synchronous_commit: bool = True,
    platform_scope: bool = False,
) -> AsyncEngine:
    """One connection to ``engine``'s database for a single busy writer (the usage ledger).

    No ping before each use: the writer retries a failed batch, and a dead connection is
    replaced then; the ping would cost a round trip per batch. ``synchronous_commit=False``
    (``KILN_LEDGER_SYNCHRONOUS_COMMIT``) sets it in the start-up packet: no round trip either.
    """
    url = engine.url.render_as_string(hide_password=False)
    return create_engine(
        url, 1, pre_ping=False, role=role, connect_timeout_s=connect_timeout_s,
        password=password, synchronous_commit=synchronous_commit, platform_scope=platform_scope,
    )  # fmt: skip


class PlatformSession(Session):
    """A session for platform-wide work: each transaction declares ``kiln.scope = 'platform'``,
    so row-level security lets it see every tenant's rows."""


@event.listens_for(PlatformSession, "after_begin")
def _declare_platform_scope(_: Session, __: SessionTransaction, connection: Connection) -> Any:
    connection.exec_driver_sql(PLATFORM_SCOPE)


def sessionmaker(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    """Session factory for platform work (see ``PlatformSession``); objects stay usable after
    commit. A tenant-confined transaction switches to ``kiln_tenant`` (``admin.deps``), where
    the platform scope has no policy."""
    return async_sessionmaker(engine, expire_on_commit=False, sync_session_class=PlatformSession)


def writer_sessions(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    """Session factory for a ``writer_engine(..., platform_scope=True)``: its connections are
    platform-scoped from the start, so a transaction skips ``PlatformSession``'s declaration,
    a round trip each (the ledger's batch is a handful of statements; this was one of them)."""
    return async_sessionmaker(engine, expire_on_commit=False)
