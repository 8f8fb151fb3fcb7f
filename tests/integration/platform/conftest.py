"""Helpers for platform tests that run the real app in-process."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from litestar import Litestar


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
