"""This gateway in a shared fleet (``KILN_SHARED_WORKERS``, issue 21): every ``interval`` it
checks leadership (``pools.leader``), heartbeats its registry row with the pool sizes its
policy wants, and then

- as the leader: registers its ready workers for the other gateways, sizes every pool to the
  largest any live gateway wants and writes the sizes it applied (``fleet_pools``);
- as a follower: reads the registered workers and dispatches to them.

Rows whose heartbeat is older than ``ttl`` are dead: a gateway that stops beating leaves the
registry, and the workers of a leader that died leave every follower's pools.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import uuid
from datetime import timedelta
from typing import TYPE_CHECKING

import structlog
from prometheus_client import REGISTRY
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from sqlalchemy import delete, func, select
from sqlalchemy.dialects.postgresql import insert

from kiln_platform.pools.tables import FleetGateway, FleetPool, FleetReplica

if TYPE_CHECKING:
    from collections.abc import Iterator

    from prometheus_client.core import Metric
    from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

    from kiln_platform.pools.leader import LeaderElector
    from kiln_platform.pools.shared import SharedBackend

log = structlog.get_logger("kiln.pools")


class Fleet:
    """The gateway registry, leadership and the shared workers, kept every ``interval``."""

    def __init__(
        self, sessions: async_sessionmaker[AsyncSession], elector: LeaderElector,
        backend: SharedBackend, lock_db: AsyncEngine, *, interval: float = 1.0, ttl: float = 5.0,
    ) -> None:  # fmt: skip
        self.id = uuid.uuid4()
        self._sessions = sessions
        self.elector = elector
        self._backend = backend
        self._lock_db = lock_db
        self._interval = interval
        self._ttl = timedelta(seconds=ttl)
        self._task: asyncio.Task[None] | None = None
        self.gateways = 1
        self.desired: dict[str, int] = {}
        """Each pool's size as the leader last applied it (read from ``fleet_pools``)."""
        elector.on_change = backend.lead
        self._collector = _Collector(self)

    async def start(self) -> None:
        """Take part: try for leadership and beat once (before the pools start), then go on."""
        await self.beat()
        REGISTRY.register(self._collector)
        self._task = asyncio.create_task(self._loop(), name="fleet")

    async def stop(self) -> None:
        """Leave: stop beating, give leadership up, remove this gateway's rows (its workers'
        too, unless they outlive it: pods stay registered until the next leader's beat)."""
        if self._task is not None:
            REGISTRY.unregister(self._collector)
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        with contextlib.suppress(Exception):
            async with self._sessions.begin() as session:
                if not self._backend.workers_outlive_gateway:  # pods serve on: rows stay
                    mine = FleetReplica.gateway_id == self.id
                    await session.execute(delete(FleetReplica).where(mine))
                await session.execute(delete(FleetGateway).where(FleetGateway.id == self.id))
        await self.elector.release()
        await self._lock_db.dispose()

    def details(self) -> dict[str, object]:
        """What readiness reports of the fleet: this gateway's part, and each pool's size as
        the leader applied it (``fleet_pools``, read at every beat)."""
        return {"gateway": str(self.id), "leader": self.elector.leader,
                "gateways": self.gateways, "pools": dict(self.desired)}  # fmt: skip

    async def beat(self) -> None:
        """One round: leadership, heartbeat, then register (leader) or discover (follower)."""
        was, leader = self.elector.leader, await self.elector.check()
        async with self._sessions.begin() as session:
            await self._heartbeat(session, leader)
            alive = FleetGateway.heartbeat_at > func.now() - self._ttl
            others = (await session.scalars(
                select(FleetGateway.wishes).where(alive, FleetGateway.id != self.id)
            )).all()  # fmt: skip
            self.gateways = 1 + len(others)
            self._backend.gateways = self.gateways
            self._backend.wishes = [dict(w) for w in others]
            if leader:
                self._backend.apply()
                if was or not self._backend.workers_outlive_gateway:
                    await self._register(session)
                # else a new term over pods that outlived the last leader: its rows stand one
                # beat more while ours are checked (registering none yet would empty the pools)
            else:
                rows = await session.scalars(
                    select(FleetReplica).where(FleetReplica.heartbeat_at > func.now() - self._ttl)
                )
                self._backend.discover(list(rows.all()))
            pools = await session.execute(select(FleetPool.pool, FleetPool.desired))
            self.desired = {pool: desired for pool, desired in pools.all()}

    async def _heartbeat(self, session: AsyncSession, leader: bool) -> None:
        row = {"id": self.id, "host": socket.gethostname(), "pid": os.getpid(),
               "leader": leader, "wishes": self._backend.wanted}  # fmt: skip
        upsert = insert(FleetGateway).values(row)
        await session.execute(upsert.on_conflict_do_update(
            index_elements=[FleetGateway.id],
            set_={"leader": leader, "wishes": row["wishes"], "heartbeat_at": func.now()},
        ))  # fmt: skip
        await session.execute(  # dead gateways' rows go (the registry lists the live ones)
            delete(FleetGateway).where(FleetGateway.heartbeat_at < func.now() - 12 * self._ttl)
        )

    async def _register(self, session: AsyncSession) -> None:
        """The leader's ready workers, for the others; the sizes it applied."""
        backend, rows = self._backend, []
        for key in backend.specs:
            for worker in backend.ready(key):
                info = worker.info
                rows.append({
                    "url": worker.url, "pool": key, "gateway_id": self.id,
                    "task": info.task if info else "embeddings",
                    "slots": backend.local.credits(worker),
                    "max_batch_size": info.max_batch_size if info else 1,
                    "max_queue": info.max_queue if info else 0,
                })  # fmt: skip
        await session.execute(delete(FleetReplica).where(
            FleetReplica.url.not_in([r["url"] for r in rows])
        ))  # fmt: skip
        if rows:
            upsert = insert(FleetReplica).values(rows)
            await session.execute(upsert.on_conflict_do_update(
                index_elements=[FleetReplica.url],
                set_={"pool": upsert.excluded.pool, "gateway_id": self.id,
                      "slots": upsert.excluded.slots, "heartbeat_at": func.now()},
            ))  # fmt: skip
        applied = [{"pool": k, "desired": n, "gateway_id": self.id}
                   for k, n in backend.applied().items()]  # fmt: skip
        await session.execute(delete(FleetPool).where(FleetPool.pool.not_in(list(backend.specs))))
        if applied:
            upsert_pools = insert(FleetPool).values(applied)
            await session.execute(upsert_pools.on_conflict_do_update(
                index_elements=[FleetPool.pool],
                set_={"desired": upsert_pools.excluded.desired, "gateway_id": self.id,
                      "updated_at": func.now()},
            ))  # fmt: skip

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self.beat()
            except Exception:  # the next round tries again
                log.exception("fleet heartbeat failed")


class _Collector:
    """``kiln_fleet_*``: leadership, its changes and the live gateways, read at scrape."""

    def __init__(self, fleet: Fleet) -> None:
        self._fleet = fleet

    def collect(self) -> Iterator[Metric]:
        fleet = self._fleet
        leader = GaugeMetricFamily(
            "kiln_fleet_leader", "1 while this gateway runs the pool manager (leader election)."
        )
        leader.add_metric([], float(fleet.elector.leader))
        changes = CounterMetricFamily(
            "kiln_fleet_leader_changes", "Times this gateway became or stopped being the leader."
        )
        changes.add_metric([], float(fleet.elector.changes))
        gateways = GaugeMetricFamily("kiln_fleet_gateways", "Live gateways sharing the workers.")
        gateways.add_metric([], float(fleet.gateways))
        yield from (leader, changes, gateways)
