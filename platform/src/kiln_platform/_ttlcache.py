"""A TTL cache whose concurrent misses of one key share one load (no thundering herd).

When a hot entry expires under load, the first request loads it and the others await that same
load instead of each querying the database: at 400 requests/s with a 5 s TTL a herd of tens of
identical queries (and row-lock waits on ``last_used_at``) stalled a request in a hundred.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


SWEEP_EVERY_S = 10.0
"""At most how often a cache that is written to drops its long-expired values."""


class TTLCache(Generic[K, V]):
    """Values fresh for ``ttl`` seconds and held ``keep_s`` seconds more (for :meth:`stale` and
    :meth:`peek` while the database is unreachable), then dropped by a sweep that runs with a
    write at most every ``SWEEP_EVERY_S``: keys that are never asked again (revoked and rotated
    API keys, a tenant's old OAuth clients) do not pile up. Cleared wholesale past ``max_size``
    entries."""

    def __init__(self, ttl: float, max_size: int = 100_000, *, keep_s: float = 300.0) -> None:
        self._ttl = ttl
        self._keep_s = keep_s
        self._max_size = max_size
        self._values: dict[K, tuple[float, V]] = {}
        self._loading: dict[K, asyncio.Future[V]] = {}
        self._swept = time.monotonic()

    def __len__(self) -> int:
        return len(self._values)

    async def get(self, key: K, load: Callable[[], Awaitable[V]]) -> V:
        """The cached value, or the result of one shared ``load()``."""
        hit = self._values.get(key)
        if hit is not None and hit[0] >= time.monotonic():
            return hit[1]
        pending = self._loading.get(key)
        if pending is None:
            pending = self._loading[key] = asyncio.ensure_future(self._load(key, load))
        return await asyncio.shield(pending)

    def forget(self, key: K) -> None:
        """Drop ``key``'s value: the next ``get`` loads it again."""
        self._values.pop(key, None)

    def forget_where(self, stale: Callable[[V], bool]) -> None:
        """Drop every value ``stale`` picks (a scan: for rare changes, not the request path)."""
        for key in [k for k, (_, v) in self._values.items() if stale(v)]:
            self._values.pop(key, None)

    def fresh(self, key: K) -> V | None:
        """The value held for ``key`` if it has not expired, without loading."""
        hit = self._values.get(key)
        return None if hit is None or hit[0] < time.monotonic() else hit[1]

    def peek(self, key: K) -> V | None:
        """The value held for ``key``, fresh or not, without loading."""
        hit = self._values.get(key)
        return None if hit is None else hit[1]

    def stale(self, key: K, grace: float) -> tuple[V] | None:
        """The value held for ``key`` if it expired less than ``grace`` seconds ago (boxed: the
        value may be None), for when loading fails (the database is unreachable)."""
        hit = self._values.get(key)
        if hit is None or hit[0] + grace < time.monotonic():
            return None
        return (hit[1],)

    async def _load(self, key: K, load: Callable[[], Awaitable[V]]) -> V:
        try:
            value = await load()
            now = time.monotonic()
            if len(self._values) >= self._max_size:
                self._values.clear()
            elif now - self._swept >= SWEEP_EVERY_S:
                self._sweep(now)
            self._values[key] = (now + self._ttl, value)
            return value
        finally:
            del self._loading[key]

    def _sweep(self, now: float) -> None:
        """Drop the values expired more than ``keep_s`` ago."""
        self._swept, oldest = now, now - self._keep_s
        for key in [k for k, (expires, _) in self._values.items() if expires < oldest]:
            del self._values[key]
