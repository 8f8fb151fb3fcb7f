"""The pool manager: one pool per registered model, its scheduler, and routing to ready workers."""

from __future__ import annotations

import asyncio
import contextlib
from functools import partial
from typing import TYPE_CHECKING

import structlog

from kiln_platform.errors import ServiceUnavailable
from kiln_platform.pools import metrics
from kiln_platform.pools.local import LocalBackend, PoolSpec, Worker
from kiln_platform.scheduler.core import PoolScheduler, SchedulerConfig
from kiln_platform.scheduler.runner import PoolRunner

if TYPE_CHECKING:
    from kiln_platform.registry.services import Resolver
    from kiln_runtimes.store import ArtifactStore

log = structlog.get_logger("kiln.pools")


class PoolManager:
    """Reconciles pools with the registry every ``interval`` seconds; routes to ready workers."""

    def __init__(
        self,
        backend: LocalBackend,
        resolver: Resolver,
        store: ArtifactStore,
        scheduler: SchedulerConfig | None = None,
        interval: float = 2.0,
    ) -> None:
        self.backend = backend
        self.runners: dict[str, PoolRunner] = {}
        self._resolver = resolver
        self._store = store
        self._scheduler = scheduler or SchedulerConfig()
        self._interval = interval
        self._task: asyncio.Task[None] | None = None
        backend.on_change = self._worker_changed

    async def start(self) -> None:
        """Reconcile once, then keep reconciling in the background."""
        self._collector = metrics.register(self)
        await self.reconcile()
        self._task = asyncio.create_task(self._loop(), name="pool-manager")

    async def stop(self) -> None:
        """Stop reconciling and stop every worker."""
        metrics.unregister(self._collector)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.backend.stop()

    async def reconcile(self) -> None:
        """Ensure a pool for the newest version of every registered model."""
        for v in await self._resolver.refresh():
            self.backend.ensure(PoolSpec(v.model, v.version, self._store.path(v.artifact_digest)))
            if v.model not in self.runners:
                self.runners[v.model] = self._runner(v.model)

    def runner(self, model: str) -> PoolRunner:
        """The scheduler of ``model``'s pool; ``ServiceUnavailable`` while no worker is ready.

        There is no scale-from-zero yet, so a pool without a ready worker answers at once
        rather than holding requests.
        """
        worker = self.backend.workers.get(model)
        runner = self.runners.get(model)
        if worker is None or runner is None:
            raise ServiceUnavailable(f"No worker pool for `{model}` yet.", retry_after=2.0)
        if not worker.ready:
            raise ServiceUnavailable(
                f"The model `{model}` is starting; retry shortly.",
                retry_after=self.backend.retry_after(worker),
            )
        return runner

    def worker(self, model: str, url: str) -> Worker:
        """The worker a dispatch named (it may have gone away since)."""
        worker = self.backend.workers.get(model)
        if worker is None or worker.url != url or not worker.ready:
            raise ServiceUnavailable(f"The worker for `{model}` went away.", retry_after=1.0)
        return worker

    def mark_unreachable(self, worker: Worker) -> None:
        """Take a worker out of rotation after a connection failure."""
        self.backend.suspect(worker)

    def _runner(self, model: str) -> PoolRunner:
        runner = PoolRunner(
            PoolScheduler(self._scheduler),
            partial(self._credits, model),
            partial(self._capacity, model),
        )
        runner.on_wait = partial(metrics.observe_wait, model)
        return runner

    def _credits(self, model: str) -> dict[str, int]:
        worker = self.backend.workers.get(model)
        if worker is None or not worker.ready:
            return {}
        return {worker.url: self.backend.credits(worker)}

    def _capacity(self, model: str) -> dict[str, float]:
        """Items each ready worker's batch queue holds (none for generation workers)."""
        worker = self.backend.workers.get(model)
        if worker is None or worker.info is None or not worker.info.max_queue:
            return {}
        return {worker.url: worker.info.max_queue}

    def _worker_changed(self, worker: Worker) -> None:
        runner = self.runners.get(worker.spec.model)
        if runner is not None:
            runner.poke()

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self.reconcile()
            except Exception:  # the next round tries again
                log.exception("pool reconcile failed")
