"""The pool manager: keeps one pool per registered model and routes requests to ready workers."""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

import structlog

from kiln_platform.errors import ServiceUnavailable
from kiln_platform.pools.local import LocalBackend, PoolSpec, Worker

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
        interval: float = 2.0,
    ) -> None:
        self.backend = backend
        self._resolver = resolver
        self._store = store
        self._interval = interval
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Reconcile once, then keep reconciling in the background."""
        await self.reconcile()
        self._task = asyncio.create_task(self._loop(), name="pool-manager")

    async def stop(self) -> None:
        """Stop reconciling and stop every worker."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.backend.stop()

    async def reconcile(self) -> None:
        """Ensure a pool for the newest version of every registered model."""
        for v in await self._resolver.refresh():
            self.backend.ensure(PoolSpec(v.model, v.version, self._store.path(v.artifact_digest)))

    def route(self, model: str) -> Worker:
        """A ready worker for ``model``, or ``ServiceUnavailable`` with a retry hint."""
        worker = self.backend.workers.get(model)
        if worker is None:
            raise ServiceUnavailable(f"No worker pool for `{model}` yet.", retry_after=2.0)
        if not worker.ready:
            raise ServiceUnavailable(
                f"The model `{model}` is starting; retry shortly.",
                retry_after=self.backend.retry_after(worker),
            )
        return worker

    def mark_unreachable(self, worker: Worker) -> None:
        """Take a worker out of rotation after a connection failure."""
        self.backend.suspect(worker)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self.reconcile()
            except Exception:  # the next round tries again
                log.exception("pool reconcile failed")
