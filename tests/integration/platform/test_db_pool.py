"""The app's PostgreSQL pool is opened to its size when serving starts and stays there: a
burst opens more, which close as they are returned (docs/reliability.md, the soak). Counted
on the server (``pg_stat_activity``), not only in SQLAlchemy's pool."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import pytest
from sqlalchemy import text

from kiln_console.compose import create_app
from kiln_platform.db.engine import asyncpg_url, create_engine, fill
from kiln_platform.settings import Settings

from .conftest import serving

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from sqlalchemy.ext.asyncio import AsyncEngine

POOL_SIZE = 10
"""``db.engine.create_engine``'s default, the app's."""
KILN_BACKENDS = text(
    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
    " AND application_name = 'kiln' AND pid <> pg_backend_pid()"
)


async def _backends(probe: AsyncEngine) -> int:
    """The server's connections named ``kiln`` to this database, the probe's own aside."""
    async with probe.connect() as conn:
        return int((await conn.execute(KILN_BACKENDS)).scalar_one())


async def _burst(engine: AsyncEngine, n: int) -> None:
    """``n`` connections at once, each held for a moment."""

    async def hold() -> None:
        async with engine.connect() as conn:
            await conn.execute(text("SELECT pg_sleep(0.3)"))

    await asyncio.gather(*(hold() for _ in range(n)))


@pytest.fixture
async def probe(database_uri: str) -> AsyncIterator[AsyncEngine]:
    """An engine of its own to count the others' connections from."""
    engine = create_engine(asyncpg_url(database_uri), pool_size=1)
    yield engine
    await engine.dispose()


async def test_fill_opens_the_pool_to_its_size_and_a_burst_leaves_it_there(
    database_uri: str, probe: AsyncEngine
) -> None:
    engine = create_engine(asyncpg_url(database_uri), pool_size=4)
    try:
        assert await _backends(probe) == 0
        await fill(engine)
        assert (await _backends(probe), engine.pool.checkedin()) == (4, 4)  # type: ignore[attr-defined]
        await _burst(engine, 8)  # 4 past the size: overflow, closed when returned
        assert (await _backends(probe), engine.pool.checkedin()) == (4, 4)  # type: ignore[attr-defined]
    finally:
        await engine.dispose()
    assert await _backends(probe) == 0


async def test_a_serving_gateway_holds_its_pool_size_from_the_start(
    database_uri: str, probe: AsyncEngine, tmp_path_factory: pytest.TempPathFactory
) -> None:
    settings = Settings(
        data_dir=tmp_path_factory.mktemp("data"), database_url=database_uri,
        warm_standby=False, worker_threads=1,
    )  # fmt: skip
    app = create_app(settings)
    async with serving(app):
        engine = app.state.kiln.db.engine
        started = await _backends(probe)
        assert engine.pool.checkedin() + engine.pool.checkedout() == POOL_SIZE
        await _burst(engine, POOL_SIZE + 5)
        assert await _backends(probe) == started
    assert started == POOL_SIZE, started  # the pool (the ledger's own opens at its first write)
