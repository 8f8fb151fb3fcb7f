"""The gateway's HTTP connections to its workers: kept alive between requests, most recently
used first, so the ones a burst opened idle out and close (``docs/reliability.md``, soak)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import aiohttp

from kiln_platform.pools.backend import worker_headers

if TYPE_CHECKING:
    from aiohttp.client_proto import ResponseHandler
    from aiohttp.client_reqrep import ConnectionKey

    from kiln_platform.settings import Settings

IDLE_CLOSE_S = 15.0
"""A kept-alive connection to a worker closes after this long unused (aiohttp's default; the
workers keep theirs 75 s, so the gateway closes first and never sends on a closing socket)."""


class StackConnector(aiohttp.TCPConnector):
    """A connector that reuses the most recently released connection first.

    aiohttp reuses first-in first-out: at steady load every kept connection is used in turn, so
    none idles out and the pool stays at the peak concurrency it once reached. Reused last-in
    first-out, the steady load keeps the few it needs and the rest close after
    ``keepalive_timeout``: the count follows the concurrency of the last seconds, bounded by
    the scheduler's credits per worker."""

    def _release(
        self, key: ConnectionKey, protocol: ResponseHandler, *, should_close: bool = False
    ) -> None:
        super()._release(key, protocol, should_close=should_close)
        kept = self._conns.get(key)
        if kept and kept[-1][0] is protocol:  # kept: appended last, taken (popleft) first
            kept.rotate(1)


def worker_session(settings: Settings) -> aiohttp.ClientSession:
    """The HTTP session to workers (used for nothing else): every call carries the secret."""
    return aiohttp.ClientSession(
        connector=StackConnector(limit=0, keepalive_timeout=IDLE_CLOSE_S),
        headers=worker_headers(settings),
    )
