"""Many gateways, one fleet (issue 21) on the real database: two electors take turns at the
pool manager's advisory lock, and a follower dispatches to the workers the leader registered."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
import psutil
import pytest
from pydantic import SecretStr
from sqlalchemy import text

from kiln_platform.db.database import Database
from kiln_platform.db.engine import asyncpg_url, create_engine, writer_engine
from kiln_platform.pools.backend import PoolSpec, worker_headers
from kiln_platform.pools.fleet import Fleet
from kiln_platform.pools.leader import LeaderElector
from kiln_platform.pools.local import LocalPoolBackend
from kiln_platform.pools.shared import SharedBackend
from kiln_platform.settings import Settings

pytestmark = pytest.mark.integration


@contextlib.asynccontextmanager
async def elector(db: Database, name: str) -> AsyncIterator[LeaderElector]:
    lock_db = writer_engine(db.engine, db.set_role)
    candidate = LeaderElector(lock_db, name, retry_s=0.5)
    try:
        yield candidate
    finally:
        await candidate.release()
        await lock_db.dispose()


async def test_one_leader_at_a_time_and_a_release_hands_over(db: Database) -> None:
    async with elector(db, "a") as a, elector(db, "b") as b:
        seen: list[bool] = []
        b.on_change = seen.append
        assert await a.check()
        assert not await b.check()
        assert await a.check()  # still held: the same term
        assert (a.leader, b.leader, a.changes) == (True, False, 1)
        await a.release()
        assert not a.leader
        assert await b.check()
        assert not await a.check()
        assert seen == [True]


async def test_a_leader_whose_session_dies_loses_the_lock_to_the_next_try(
    db: Database, database_uri: str
) -> None:
    owner = create_engine(asyncpg_url(database_uri), pool_size=1)
    async with elector(db, "a") as a, elector(db, "b") as b:
        assert await a.check()
        async with owner.connect() as conn:  # the leader's connection dies (as with SIGKILL)
            killed = await conn.scalar(text(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_locks"
                " WHERE locktype = 'advisory' AND granted"
                " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            ))  # fmt: skip
            await conn.commit()
        assert killed == 1
        started = time.monotonic()
        while not await b.check():
            assert time.monotonic() - started < 5, "nobody took the lock over"
            await asyncio.sleep(0.1)
        assert not await a.check()  # its next check finds the session gone: a follower
        assert (a.leader, a.changes) == (False, 2)
    await owner.dispose()


@contextlib.asynccontextmanager
async def gateway(db: Database, settings: Settings) -> AsyncIterator[Fleet]:
    """A gateway's fleet part: a shared local backend and its registry heartbeat (not started:
    the test beats)."""
    async with aiohttp.ClientSession(headers=worker_headers(settings)) as http:
        backend = SharedBackend(LocalPoolBackend(settings, http))
        lock_db = writer_engine(db.engine, db.set_role)
        fleet = Fleet(db.sessions, LeaderElector(lock_db, "gw"), backend, lock_db)
        try:
            yield fleet
        finally:
            await fleet.stop()
            await backend.stop()


async def _until(probe: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + 30
    while not probe():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


async def test_a_follower_dispatches_to_the_leaders_workers_and_takes_over_when_it_leaves(
    db: Database, model_dir: Path, tmp_path: Path
) -> None:
    settings = Settings(data_dir=tmp_path / "data", secret_key=SecretStr("fleet"),
                        warm_standby=False, worker_threads=1, shared_workers=True)  # fmt: skip
    spec = PoolSpec("mlp", "1", model_dir)
    async with gateway(db, settings) as a, gateway(db, settings) as b:
        shared_a, shared_b = a._backend, b._backend
        for fleet in (a, b, a):
            await fleet.beat()
        assert (a.elector.leader, b.elector.leader, a.gateways, b.gateways) == (
            True, False, 2, 2,
        )  # fmt: skip
        for shared in (shared_a, shared_b):
            shared.ensure(spec)
        shared_b.own = {spec.key: 1}  # the follower's policy wants a worker
        await b.beat()
        await a.beat()  # the leader reads the wish and starts it
        await _until(lambda: shared_a.ready(spec.key), "the leader's worker never got ready")
        (worker,) = shared_a.ready(spec.key)
        assert worker.process is not None
        assert "--slots" in psutil.Process(worker.process.pid).cmdline()
        await a.beat()
        await b.beat()
        assert [w.url for w in shared_b.ready(spec.key)] == [worker.url]
        assert shared_b.local.pools == {}  # the follower started nothing
        assert b.details()["pools"] == {spec.key: 1}  # readiness shows the leader's sizes
        await a.stop()  # leaves: releases the lock, its worker drains
        await b.beat()
        assert b.elector.leader
        await _until(lambda: shared_b.ready(spec.key), "the new leader's worker never got ready")
        assert [w.url for w in shared_b.ready(spec.key)] != [worker.url]
