"""The TTL cache: hits, expiry, one shared load for concurrent misses, failures not cached."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from kiln_platform._ttlcache import SWEEP_EVERY_S, TTLCache


async def test_concurrent_misses_share_one_load_and_hits_do_not_load() -> None:
    cache: TTLCache[str, int] = TTLCache(ttl=60)
    loads = 0

    async def load() -> int:
        nonlocal loads
        loads += 1
        await asyncio.sleep(0.01)
        return 7

    assert await asyncio.gather(*(cache.get("k", load) for _ in range(50))) == [7] * 50
    assert await cache.get("k", load) == 7
    assert loads == 1
    assert cache.peek("k") == 7


async def test_an_expired_value_is_loaded_again() -> None:
    cache: TTLCache[str, int] = TTLCache(ttl=0)
    values = iter([1, 2])

    async def load() -> int:
        return next(values)

    assert await cache.get("k", load) == 1
    await asyncio.sleep(0.001)
    assert await cache.get("k", load) == 2


async def test_a_failed_load_reaches_every_waiter_and_is_not_cached() -> None:
    cache: TTLCache[str, int] = TTLCache(ttl=60)
    calls = 0

    async def boom() -> int:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.01)
        raise RuntimeError("db down")

    results = await asyncio.gather(
        *(cache.get("k", boom) for _ in range(3)), return_exceptions=True
    )
    assert all(isinstance(r, RuntimeError) for r in results)
    assert calls == 1  # one shared load, its failure handed to every waiter

    async def ok() -> int:
        return 1

    assert await cache.get("k", ok) == 1


async def test_a_cancelled_waiter_does_not_cancel_the_shared_load() -> None:
    cache: TTLCache[str, int] = TTLCache(ttl=60)

    async def load() -> int:
        await asyncio.sleep(0.02)
        return 3

    first = asyncio.ensure_future(cache.get("k", load))
    second = asyncio.ensure_future(cache.get("k", load))
    await asyncio.sleep(0.005)
    first.cancel()
    assert await second == 3
    assert cache.peek("k") == 3


async def test_a_forgotten_value_is_loaded_again_before_it_expires() -> None:
    cache: TTLCache[str, int | None] = TTLCache(ttl=60)
    values = iter([None, 3])

    async def load() -> int | None:
        return next(values)

    assert await cache.get("k", load) is None  # a miss, cached
    cache.forget("k")
    assert await cache.get("k", load) == 3


async def test_a_stale_value_is_kept_within_its_grace_only() -> None:
    cache: TTLCache[str, int | None] = TTLCache(ttl=0)

    async def load() -> int | None:
        return None

    assert cache.stale("k", 60) is None, "never loaded"
    await cache.get("k", load)
    assert cache.stale("k", 60) == (None,), "a cached None is a value"
    await asyncio.sleep(0.01)
    assert cache.stale("k", 0) is None


async def test_values_never_asked_again_are_swept_after_their_keep_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A revoked or rotated key's entry does not stay until the cache is full (the soak's
    steady gateway growth, issue 23): a later write drops what expired ``keep_s`` ago."""
    now = [1000.0]
    clock = SimpleNamespace(monotonic=lambda: now[0])
    monkeypatch.setattr("kiln_platform._ttlcache.time", clock)
    cache: TTLCache[str, int] = TTLCache(ttl=5, keep_s=60)

    async def one() -> int:
        return 1

    for i in range(100):
        await cache.get(f"old-{i}", one)
    now[0] += 5 + 30  # expired, still within keep_s: kept (a stale key in an outage)
    await cache.get("k1", one)
    assert len(cache) == 101
    assert cache.stale("old-0", grace=60) == (1,)
    now[0] += 40 + SWEEP_EVERY_S  # expired past keep_s
    await cache.get("k2", one)
    assert len(cache) == 2  # k1 expired too, but within its keep time
