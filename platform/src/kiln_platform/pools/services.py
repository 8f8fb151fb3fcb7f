"""The pool manager: one pool per served model version (``model@version``: the newest, or a
route's stable and canary), its scheduler, its size, and routing to ready workers.

Every ``tick`` it asks the autoscaling policy (``pools.autoscale``) how many workers each pool
should run, from the work in its scheduler, and tells the backend. A request for a pool at zero
starts a worker at once and waits in the pool's queue, within its deadline, until the worker is
ready (Knative's activator): a cold start costs latency, not an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING

import structlog

from kiln_platform.errors import ServiceUnavailable
from kiln_platform.observability import request_started
from kiln_platform.pools import autoscale, metrics
from kiln_platform.pools.autoscale import AutoscaleConfig, AutoscaleState, PoolLoad
from kiln_platform.pools.backend import BACKGROUND, PoolSize, PoolSpec, PoolWorker
from kiln_platform.pools.coldstart import ColdStarts
from kiln_platform.registry.engine import worker_settings
from kiln_platform.scheduler.core import PoolScheduler, SchedulerConfig
from kiln_platform.scheduler.runner import EXPRESS_CREDITS, PoolRunner
from kiln_platform.scheduler.schemas import Priority

if TYPE_CHECKING:
    from collections.abc import Callable

    from kiln_platform.pools.backend import PoolBackend
    from kiln_platform.registry.resolver import Resolver
    from kiln_platform.registry.services import ResolvedVersion
    from kiln_runtimes.store import ArtifactStore

log = structlog.get_logger("kiln.pools")


@dataclass(frozen=True, slots=True)
class PoolLive:
    """A pool's replicas by state, its queue and its cold starts since the gateway started."""

    model: str
    version: str
    desired: int
    starting: int
    ready: int
    draining: int
    queued: int
    cold_starts: int


class PoolManager:
    """Reconciles pools with the registry every ``interval`` seconds and sizes them every
    ``tick``; routes to ready workers."""

    def __init__(
        self,
        backend: PoolBackend,
        resolver: Resolver,
        store: ArtifactStore,
        scheduler: SchedulerConfig | None = None,
        interval: float = 2.0,
        *,
        scaling: AutoscaleConfig | None = None,
        tick: float = 0.5,
        observe_wait: Callable[[str, str, str, float], None] | None = None,
        twins: bool = False,
    ) -> None:
        self.backend = backend
        self.runners: dict[str, PoolRunner] = {}
        self.desired: dict[str, int] = {}
        """Each pool's replicas (by ``PoolSpec.key``), as the policy last decided."""
        self._resolver = resolver
        self._store = store
        self._scheduler = scheduler or SchedulerConfig()
        self._scaling = scaling or AutoscaleConfig()
        self._states: dict[str, AutoscaleState] = {}
        self._configs: dict[str, AutoscaleConfig] = {}
        """Each pool's policy knobs: the deployment's, within its version's own bounds."""
        self._last_request: dict[str, float] = {}
        self._interval = interval
        self._tick = tick
        self._observe_wait = observe_wait
        """Called with (model, version, tenant, seconds) of each request's queue wait."""
        self._task: asyncio.Task[None] | None = None
        self._sizer: asyncio.Task[None] | None = None
        self.cold_starts = ColdStarts()
        self._twins = twins
        self.express: Callable[[], int] = lambda: EXPRESS_CREDITS
        """Express credits per worker (a shared fleet's backend divides them, ``_pool_manager``)."""
        """Batch-class work runs in each pool's background twin (``route``)."""
        backend.on_change = self._worker_changed

    async def start(self) -> None:
        """Reconcile once, then keep reconciling in the background."""
        self._collector = metrics.register(self)
        await self.reconcile()
        self._task = asyncio.create_task(self._loop(), name="pool-manager")
        self._sizer = asyncio.create_task(self._size_loop(), name="pool-autoscaler")

    async def stop(self) -> None:
        """Stop reconciling and sizing, and stop every worker."""
        metrics.unregister(self._collector)
        for task in (self._task, self._sizer):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self.backend.stop()

    async def reconcile(self) -> None:
        """A pool for every served version; pools no route serves any more are retired. Then
        the backend knows every pool wanted (``reconciled``: it may delete what none wants)."""
        served = {v.pool: v for v in await self._resolver.refresh()}
        for version in served.values():
            self._adopt(version)
        twins = {f"{key}{BACKGROUND}" for key in served if self._twinned(key)}
        for key in set(self._states) - set(served) - twins:
            busy = self.runners[key].scheduler
            if busy.in_flight or len(busy.queue):
                continue  # no new request routes here: retire it once its work is done
            log.info("pool retired", pool=key)
            del self._states[key]
            self._configs.pop(key, None)
            self.desired.pop(key, None)
            self._last_request.pop(key, None)
            del self.runners[key]
            self.backend.remove(key)
        self.backend.reconciled()

    def _adopt(self, version: ResolvedVersion) -> None:
        """Give a served version its pool, sized by the policy's initial rule; its bounds
        (``min_replicas``/``max_replicas``) change the pool's size, not its workers. Its
        background twin, if it has one, follows its engine settings."""
        only_shadow = (version.model, version.version) in self._resolver.candidates
        spec = PoolSpec(
            version.model, version.version, self._store.path(version.artifact_digest),
            worker_settings(version.engine), idle=only_shadow,
        )  # fmt: skip
        engine = version.engine
        config = autoscale.bounded(self._scaling, engine.min_replicas, engine.max_replicas)
        self._keep(spec, config)
        if f"{spec.key}{BACKGROUND}" in self._states and self._twinned(spec.key):
            self._keep(spec.twin(), replace(config, min_replicas=0))

    def _keep(self, spec: PoolSpec, config: AutoscaleConfig) -> None:
        """Have a pool for ``spec``: a new one at its initial size, or the one there, restarted
        if its spec changed."""
        self._configs[spec.key] = config
        if spec.key in self._states:
            if self.backend.specs.get(spec.key, spec) != spec:
                self._restart(spec)
            return
        self.backend.ensure(spec)
        self.runners.setdefault(spec.key, self._runner(spec))
        replicas, self._states[spec.key] = autoscale.initial(config, time.monotonic())
        self._resize(spec.key, replicas)

    def route(self, pool: str, priority: Priority) -> str:
        """The pool a request of ``priority`` for ``pool`` runs in: batch-class work goes to the
        pool's background twin (made now if need be; it scales to zero when idle) when the
        deployment has twins (``KILN_BATCH_TWIN``), so that batch lines run on workers at idle
        CPU priority and never share a worker, a queue or CPU time with interactive requests."""
        if priority is not Priority.BATCH or not self._twinned(pool):
            return pool
        spec = self.backend.specs[pool]
        twin = spec.twin()
        if twin.key not in self._states:
            self._keep(twin, replace(self._configs.get(pool, self._scaling), min_replicas=0))
        return twin.key

    def _twinned(self, pool: str) -> bool:
        """``pool`` has (or may have) a background twin: twins are on and it is a served
        version's pool at normal priority (not a shadow candidate's, nor a twin)."""
        spec = self.backend.specs.get(pool)
        return self._twins and spec is not None and not spec.idle

    def _restart(self, spec: PoolSpec) -> None:
        """The version's engine settings changed: its workers drain and new ones start with
        the new settings (as many as before)."""
        replicas = len(self.backend.pools.get(spec.key, []))
        log.info("pool restarting with new engine settings", pool=spec.key, replicas=replicas)
        self.backend.remove(spec.key)
        self.backend.ensure(spec)
        self.backend.scale(spec.key, replicas)

    def autoscale(self, pool: str | None = None, arriving: int = 0) -> None:
        """Size one pool (or all) by the policy; ``arriving`` requests count as queued."""
        now = time.monotonic()
        for name in [pool] if pool is not None else list(self._states):
            runner = self.runners[name]
            load = PoolLoad(
                in_flight=runner.scheduler.in_flight,
                queued=len(runner.scheduler.queue) + arriving,
                slots_per_replica=self._per_replica(name),
                last_request_at=self._last_request.get(name),
            )
            config = self._configs.get(name, self._scaling)
            replicas, self._states[name] = autoscale.decide(load, config, self._states[name], now)
            self._resize(name, replicas)

    def runner(self, pool: str) -> PoolRunner:
        """The scheduler of a pool (``model@version``), for a request about to use it.

        A pool at zero is started now; the request then waits in the pool's queue for the
        worker. A pool whose every worker crashed answers 503 at once instead.
        """
        if not self._adopted(pool):
            raise ServiceUnavailable(f"No worker pool for `{pool}` yet.", retry_after=2.0)
        runner = self.runners[pool]
        self._last_request[pool] = time.monotonic()
        if self.backend.ready(pool):
            return runner
        if self.backend.crashed(pool):
            raise ServiceUnavailable(
                f"The model `{pool}` is restarting after a crash; retry shortly.",
                retry_after=self.backend.retry_after(self.backend.pools[pool][0]),
            )
        if not self.backend.pools.get(pool):
            self.cold_starts.arrived(pool, request_started())
            self.autoscale(pool, arriving=1)
        return runner

    def warming(self, pool: str) -> bool:
        """Whether a served pool is starting: no worker of it ready, none crashed. Asking counts
        as demand, as a request would (it is kept from idling out, started now if at zero), but
        no request waits on it: a rollout's split serves stable until its canary is ready
        (``Resolver.resolve``). A crashed canary is not warming: its requests fail and its
        rollout rolls back."""
        if not self._adopted(pool) or self.backend.ready(pool) or self.backend.crashed(pool):
            return False
        self._last_request[pool] = time.monotonic()
        if not self.backend.pools.get(pool):
            self.autoscale(pool, arriving=1)
        return True

    def _adopted(self, pool: str) -> bool:
        """``pool`` has its state, adopted now if it was resolved before the next reconcile
        (false: no version it names is served)."""
        if pool not in self._states:
            model, _, version = pool.rpartition("@")
            served = self._resolver.served.get(model, {}).get(version)
            if served is None:
                return False
            self._adopt(served)
        return True

    def sizes(self) -> dict[str, PoolSize]:
        """Every pool's workers: as decided, running, ready, draining."""
        return {
            key: PoolSize(self.backend.specs[key], desired, len(self.backend.pools.get(key, [])),
                          len(self.backend.ready(key)), self.backend.draining(key))
            for key, desired in self.desired.items()
        }  # fmt: skip

    def live(self) -> list[PoolLive]:
        """Every pool as the console's fleet view shows it, read now (no database)."""
        return [
            PoolLive(size.spec.model, size.spec.label, size.desired,
                     size.running - size.ready, size.ready, size.draining,
                     len(self.runners[key].scheduler.queue) if key in self.runners else 0,
                     self.cold_starts.done[key])
            for key, size in sorted(self.sizes().items())
        ]  # fmt: skip

    def is_ready(self, pool: str) -> bool:
        """A worker of the pool takes requests now (no side effect: not a request)."""
        return bool(self.backend.ready(pool))

    def load(self, pool: str) -> tuple[int, int, int]:
        """(credits of its ready workers, requests in flight, queued) of a pool, read now with no
        side effect (neither a request nor a start): shadow copies use idle capacity only."""
        runner = self.runners.get(pool)
        if runner is None or not self.backend.ready(pool):
            return 0, 0, 0
        busy = runner.scheduler
        return sum(self._credits(pool).values()), busy.in_flight, len(busy.queue)

    def worker(self, pool: str, url: str) -> PoolWorker:
        """The worker a dispatch named (it may have gone away since)."""
        worker = self.backend.find(pool, url)
        if worker is None or not worker.ready:
            raise ServiceUnavailable(f"The worker for `{pool}` went away.", retry_after=1.0)
        return worker

    def mark_unreachable(self, worker: PoolWorker) -> None:
        """Take a worker out of rotation after a connection failure."""
        self.backend.suspect(worker)

    def _resize(self, pool: str, replicas: int) -> None:
        before = len(self.backend.pools.get(pool, []))
        decided, self.desired[pool] = self.desired.get(pool), replicas
        if replicas != before:
            if replicas != decided:  # a shared fleet's leader may size it apart from this
                log.info("pool scaled", pool=pool, replicas=replicas, was=before)
            self.backend.scale(pool, replicas)
            if pool in self.runners:  # admission's rate follows the planned size
                self.runners[pool].poke()

    def _per_replica(self, pool: str) -> int:
        ready = self.backend.ready(pool)
        return self.backend.credits(ready[0] if ready else None)

    def _runner(self, spec: PoolSpec) -> PoolRunner:
        key = spec.key
        runner = PoolRunner(
            PoolScheduler(self._scheduler),
            partial(self._credits, key),
            partial(self._capacity, key),
            planned=lambda: self.desired.get(key, 0) * self._per_replica(key),
            express=self._spare,
        )
        if self._observe_wait is not None:
            on_wait = partial(self._observe_wait, spec.model, spec.label)
            runner.on_wait = lambda request, seconds: on_wait(request.tenant, seconds)
        runner.on_done = partial(self.cold_starts.responded, spec.model, spec.label, key)
        return runner

    def _spare(self) -> int:
        return self.express()  # read now: the composition root may set it after a runner is made

    def _credits(self, pool: str) -> dict[str, int]:
        return {w.url: self.backend.credits(w) for w in self.backend.ready(pool)}

    def _capacity(self, pool: str) -> dict[str, float]:
        """Items each ready worker's batch queue holds (none for generation workers)."""
        return {
            w.url: w.info.max_queue
            for w in self.backend.ready(pool)
            if w.info is not None and w.info.max_queue
        }

    def _worker_changed(self, worker: PoolWorker) -> None:
        if worker.ready:
            self.cold_starts.ready(worker)
        runner = self.runners.get(worker.spec.key)
        if runner is not None:
            runner.poke()

    async def _size_loop(self) -> None:
        while True:
            await asyncio.sleep(self._tick)
            try:
                self.autoscale()
            except Exception:  # the next tick tries again
                log.exception("pool autoscaling failed")

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self.reconcile()
            except Exception:  # the next round tries again
                log.exception("pool reconcile failed")
