"""The pool backend of a gateway in a shared fleet (``KILN_SHARED_WORKERS``, issue 21).

It wraps the deployment's backend (``local`` or ``kubernetes``). While this gateway is the
leader it is that backend: its workers, sized to the largest any live gateway's policy wants.
While a follower it starts nothing: its pools are the workers the leader registered in
PostgreSQL (``pools.fleet``), and it dispatches to them. Either way each gateway keeps only its
share of a worker's credits in flight (``fleet_policy.gateway_share``); the worker refuses work
over its own limit (``busy``) and the gateway leases it again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import structlog

from kiln_platform.pools.backend import PoolWorker
from kiln_platform.pools.fleet_policy import fleet_replicas, gateway_share
from kiln_platform.scheduler.runner import EXPRESS_CREDITS
from kiln_runtimes.protocol import WorkerInfo

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from kiln_platform.pools.backend import PoolBackend, PoolSpec
    from kiln_platform.pools.tables import FleetReplica

log = structlog.get_logger("kiln.pools")


class SharedBackend:
    """The leader's backend while leading; the registered workers while following."""

    def __init__(self, local: PoolBackend) -> None:
        self.local = local
        self.workers_outlive_gateway = local.workers_outlive_gateway
        self.leader = False
        self.specs: dict[str, PoolSpec] = {}
        self._remote: dict[str, list[PoolWorker]] = {}
        """Followers: each pool's registered workers (by ``PoolSpec.key``)."""
        self.pools = self._remote
        """Each pool's workers: the leader's own (``local.pools``), or the registered ones."""
        self.own: Mapping[str, int] = {}
        """This gateway's policy's size of each pool: the pool manager's ``desired`` (wired by
        the composition root)."""
        self.wishes: list[Mapping[str, int]] = []
        """The other live gateways' wanted sizes (the leader sizes pools to the largest)."""
        self.gateways = 1
        """Live gateways sharing the workers (this one included)."""
        self.on_change: Callable[[PoolWorker], None] = lambda worker: None
        local.on_change = self._changed

    def _changed(self, worker: PoolWorker) -> None:
        self.on_change(worker)  # read now: the pool manager sets its own after this is built

    @property
    def wanted(self) -> dict[str, int]:
        """This gateway's wanted size of each pool (what its heartbeat publishes)."""
        return dict(self.own)

    def ensure(self, spec: PoolSpec) -> None:
        """Have a pool for ``spec``; only the leader's backend makes it."""
        self.specs.setdefault(spec.key, spec)
        if self.leader:
            self.local.ensure(spec)

    def remove(self, key: str) -> None:
        """Retire a pool (the leader's backend drains its workers)."""
        self.specs.pop(key, None)
        if self.leader:
            self.local.remove(key)

    def reconciled(self) -> None:
        """Every served pool is ensured (only the leader's backend deletes what none wants)."""
        if self.leader:
            self.local.reconciled()

    def scale(self, key: str, replicas: int) -> None:
        """The leader applies the fleet's size (this gateway's, ``replicas``, is published)."""
        if self.leader:
            self._apply(key, replicas)

    def apply(self) -> None:
        """Leader: size every pool to the largest any live gateway wants."""
        if self.leader:
            for key in list(self.specs):
                self._apply(key, self.own.get(key, 0))

    def _apply(self, key: str, own: int) -> None:
        target = fleet_replicas(own, self.wishes, key)
        if len(self.local.pools.get(key, [])) != target:
            self.local.scale(key, target)

    def applied(self) -> dict[str, int]:
        """Leader: each pool's size as applied (what followers read as desired)."""
        return {key: len(self.local.pools.get(key, [])) for key in self.specs}

    def ready(self, key: str) -> list[PoolWorker]:
        """The pool's workers that take requests."""
        if self.leader:
            return self.local.ready(key)
        return [w for w in self._remote.get(key, []) if w.ready]

    def find(self, key: str, url: str) -> PoolWorker | None:
        """The pool's worker at ``url``, if it is still there."""
        if self.leader:
            return self.local.find(key, url)
        return next((w for w in self._remote.get(key, []) if w.url == url), None)

    def draining(self, key: str) -> int:
        """Workers taken out of the pool that have not exited yet (the leader's)."""
        return self.local.draining(key) if self.leader else 0

    def crashed(self, key: str) -> bool:
        """Every worker of a non-empty pool is down after a crash (the leader knows)."""
        return self.local.crashed(key) if self.leader else False

    def suspect(self, worker: PoolWorker) -> None:
        """Out of rotation after a failed call (a follower's until the next registry read)."""
        if self.leader:
            self.local.suspect(worker)
        elif worker.ready:
            worker.ready = False
            self.on_change(worker)

    def credits(self, worker: PoolWorker | None) -> int:
        """This gateway's share of the worker's credits."""
        return gateway_share(self.local.credits(worker), self.gateways)

    def express(self) -> int:
        """This gateway's share of a worker's express credits (the worker holds
        ``EXPRESS_CREDITS`` beyond its slots for all the gateways together)."""
        return gateway_share(EXPRESS_CREDITS, self.gateways)

    def retry_after(self, worker: PoolWorker) -> float:
        """Seconds a caller should wait for this worker to become ready."""
        return self.local.retry_after(worker)

    async def stop(self) -> None:
        """Stop the leader's backend (a follower's has nothing running)."""
        await self.local.stop()

    def step_down(self) -> None:
        """Become a follower (``lead(False)``)."""
        self.lead(False)

    def lead(self, leader: bool) -> None:
        """Become the leader (make or adopt every pool, sized now) or a follower (the backend
        steps down: local workers stop, Deployments stay for the next leader)."""
        if leader == self.leader:
            return
        if leader:
            gone = [w for pool in self._remote.values() for w in pool]
            self._remote = {}
            self.leader, self.pools = True, self.local.pools
            for worker in gone:
                worker.ready = False
                self.on_change(worker)
            for spec in self.specs.values():
                self.local.ensure(spec)
            self.apply()
            return
        self.local.step_down()
        self.leader, self.pools = False, self._remote

    def discover(self, rows: list[FleetReplica]) -> None:
        """Follower: the registered workers become the pools (kept by URL, so a lease's worker
        stays the same object while it is registered). The pools are replaced before anyone
        hears of a change: a runner poked about a new worker reads ``ready`` from the new ones
        (poked earlier, a request queued before the first discovery waited for the next one)."""
        if self.leader:
            return
        found: dict[str, list[PoolWorker]] = {}
        for row in rows:
            spec = self.specs.get(row.pool)
            if spec is not None:
                found.setdefault(row.pool, []).append(self._worker(spec, row))
        before = {w.url: w for pool in self._remote.values() for w in pool}
        self._remote = self.pools = found
        after = {w.url: w for pool in found.values() for w in pool}
        changed = [w for url, w in before.items() if url not in after and w.ready]
        changed += [w for w in after.values() if not w.ready]
        for worker in changed:
            worker.ready = not worker.ready
            self.on_change(worker)

    def _worker(self, spec: PoolSpec, row: FleetReplica) -> PoolWorker:
        """The registered worker, described by its row (ready once the pools are replaced)."""
        known = self.find(row.pool, row.url)
        worker = known or PoolWorker(spec, *_host_port(row.url))
        worker.info = WorkerInfo(
            model=spec.model, version=spec.version, task=row.task,  # type: ignore[arg-type]
            ready=True, draining=False, in_flight=0, queued=0, free_slots=row.slots,
            max_batch_size=row.max_batch_size, max_queue=row.max_queue,
        )  # fmt: skip
        return worker


def _host_port(url: str) -> tuple[int, str]:
    host, _, port = url.removeprefix("http://").rpartition(":")
    return int(port), host
