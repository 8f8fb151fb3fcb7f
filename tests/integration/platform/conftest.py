"""Platform test helpers: the module's database opened, and the real app served in-process."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from litestar import Litestar

from kiln_platform.context import Database, open_database
from kiln_platform.settings import Settings


@pytest.fixture(scope="module")
async def db(
    database_uri: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Database]:
    """The module's fresh database, opened (engine and session factory), no app."""
    settings = Settings(data_dir=tmp_path_factory.mktemp("data"), database_url=database_uri)
    async with open_database(settings) as database:
        yield database


@asynccontextmanager
async def serving(app: Litestar) -> AsyncIterator[None]:
    """Run the app's lifespan (entered and left in one task, as a server would) around a block."""
    started, stop = asyncio.Event(), asyncio.Event()

    async def serve() -> None:
        async with app.lifespan():
            started.set()
            await stop.wait()

    task = asyncio.create_task(serve())
    await started.wait()
    try:
        yield
    finally:
        stop.set()
        await task
