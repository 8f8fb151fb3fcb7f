"""A webhook receiver on loopback, for the alert delivery tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from aiohttp import web


@asynccontextmanager
async def loopback(handle: Callable[[web.Request], Awaitable[web.Response]]) -> AsyncIterator[str]:
    """Serve ``handle`` at ``POST /hook`` on a free loopback port; yields its URL."""
    app = web.Application()
    app.router.add_post("/hook", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}/hook"
    finally:
        await runner.cleanup()
