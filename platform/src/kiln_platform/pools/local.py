"""The ``local`` pool backend: supervises the worker subprocesses of each pool (one pool per
served model version).

The pool manager decides how many workers a pool runs (``pools.autoscale``) and calls
``scale``; a worker taken away leaves rotation first, then gets SIGTERM and drains.

With ``warm_standby`` on, it also keeps one standby worker: a process that has already imported
the worker and the engine libraries and waits for a model (``kiln_runtimes._standby``). The next
start, restart or version change takes it, so a start costs the engine load only, and a new
standby is made once that worker is ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import sys
import time
from typing import TYPE_CHECKING, Any

import structlog

from kiln_platform.pools import backend
from kiln_platform.pools.backend import PoolSpec, PoolWorker

if TYPE_CHECKING:
    from collections.abc import Callable

    import aiohttp

    from kiln_platform.settings import Settings

__all__ = ["LocalPoolBackend"]

log = structlog.get_logger("kiln.pools")
_BACKOFF_MAX_S = 10.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalPoolBackend:
    """Starts, watches and restarts worker subprocesses on this machine."""

    workers_outlive_gateway = False
    """Its workers are its children (in a shared fleet they exit with it)."""

    def __init__(self, settings: Settings, http: aiohttp.ClientSession) -> None:
        self._settings = settings
        self._http = http
        self.pools: dict[str, list[PoolWorker]] = {}
        """Each pool's workers (by ``PoolSpec.key``), oldest first."""
        self.specs: dict[str, PoolSpec] = {}
        self._stopping = False
        self._rechecks: set[asyncio.Task[None]] = set()
        self._retiring: set[asyncio.Task[None]] = set()
        """Supervisors of workers taken out of their pool, still draining (``stop`` waits)."""
        self.on_change: Callable[[PoolWorker], None] = lambda worker: None
        """Called when a worker becomes ready or stops being ready."""
        self._standby: asyncio.subprocess.Process | None = None
        self._env = backend.worker_environment(settings, os.environ)
        """Workers' environment, taken once: never the gateway's own secrets or database URL."""

    def ensure(self, spec: PoolSpec) -> None:
        """Have a pool for ``spec`` (empty until ``scale``)."""
        self.specs.setdefault(spec.key, spec)
        self.pools.setdefault(spec.key, [])

    def remove(self, key: str) -> None:
        """Retire a pool: its workers leave rotation and drain."""
        self.scale(key, 0)
        self.specs.pop(key, None)
        self.pools.pop(key, None)

    def step_down(self) -> None:
        """Stop managing the pools (a fleet leader stepping down): its workers are its own
        processes, so they drain and stop; the next leader starts its own."""
        for key in list(self.pools):
            self.remove(key)

    def reconciled(self) -> None:
        """Nothing to sweep: this backend's workers are its own processes, none outlives it."""

    def scale(self, key: str, replicas: int) -> None:
        """Start or stop workers until the pool has ``replicas`` (starting ones go first)."""
        workers = self.pools.setdefault(key, [])
        while len(workers) < replicas:
            worker = PoolWorker(self.specs[key])
            worker.task = asyncio.create_task(self._supervise(worker), name=f"pool:{key}")
            workers.append(worker)
        while len(workers) > replicas:
            idle = [w for w in workers if not w.ready]
            worker = idle[-1] if idle else workers[-1]
            workers.remove(worker)
            self._retire(worker)

    def ready(self, key: str) -> list[PoolWorker]:
        """The pool's workers that take requests."""
        return [w for w in self.pools.get(key, []) if w.ready]

    def find(self, key: str, url: str) -> PoolWorker | None:
        """The pool's worker at ``url``, if it is still there."""
        return next((w for w in self.pools.get(key, []) if w.url == url), None)

    def draining(self, key: str) -> int:
        """Workers taken out of the pool that have not exited yet."""
        return sum(1 for task in self._retiring if task.get_name() == f"pool:{key}")

    def crashed(self, key: str) -> bool:
        """Every worker of a non-empty pool is down after a crash (so: answer 503 at once)."""
        workers = self.pools.get(key, [])
        return bool(workers) and all(w.restarts and not w.ready for w in workers)

    def _retire(self, worker: PoolWorker) -> None:
        """Out of rotation now; SIGTERM (the worker drains what it has), then gone."""
        self._set_ready(worker, False)
        if worker.task is not None:
            worker.task.cancel()
            self._retiring.add(worker.task)
            worker.task.add_done_callback(self._retiring.discard)

    def credits(self, worker: PoolWorker | None) -> int:
        """Requests the scheduler may keep in flight on ``worker`` (``backend.credits``)."""
        return backend.credits(self._settings, worker)

    def retry_after(self, worker: PoolWorker) -> float:
        """Seconds a caller should wait for this worker to become ready (a rough estimate)."""
        return backend.retry_after(self._settings, worker)

    def stopping(self) -> bool:
        """``stop()`` has begun."""
        return self._stopping

    async def stop(self) -> None:
        """Stop every worker: SIGTERM (they drain), then wait."""
        self._stopping = True
        tasks: list[asyncio.Future[Any]] = [
            w.task for pool in self.pools.values() for w in pool if w.task is not None
        ]
        tasks += self._rechecks  # readiness re-checks: the session they use closes next
        for task in tasks:
            task.cancel()
        tasks += self._retiring  # already cancelled, draining: cancelling again cuts the drain
        standby, self._standby = self._standby, None
        if standby is not None and standby.returncode is None:
            standby.terminate()
            tasks.append(asyncio.ensure_future(standby.wait()))
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _supervise(self, worker: PoolWorker) -> None:
        backoff = 0.5
        try:
            while not self._stopping:
                worker.port = _free_port()
                worker.started_at = time.monotonic()
                worker.process, warm = await self._spawn(self._arguments(worker))
                log.info(
                    "worker started", model=worker.spec.model, pid=worker.process.pid, standby=warm
                )
                deadline = worker.started_at + self._settings.worker_start_timeout_s
                watcher = asyncio.create_task(self._watch_ready(worker, deadline))
                try:
                    code = await worker.process.wait()
                finally:  # stop() cancels this task: the watcher's session closes next
                    watcher.cancel()
                self._set_ready(worker, False)
                if self.stopping():  # stop() may have run while we waited
                    return
                lived = time.monotonic() - worker.started_at
                backoff = 0.5 if lived > 30 else min(backoff * 2, _BACKOFF_MAX_S)
                worker.restarts += 1
                log.warning("worker exited", model=worker.spec.model, code=code, restart_in=backoff)
                await asyncio.sleep(backoff)
        finally:
            self._set_ready(worker, False)
            await self._terminate(worker)

    def _arguments(self, worker: PoolWorker) -> list[str]:
        """The worker's command line; shared with other gateways, it exits with this one
        (whose successor as leader starts its own)."""
        argv = backend.worker_arguments(worker.spec, self._settings, worker.port)
        return [*argv, "--exit-with-parent"] if self._settings.shared_workers else argv

    async def _spawn(self, argv: list[str]) -> tuple[asyncio.subprocess.Process, bool]:
        """Hand ``argv`` to the standby if there is one alive, else start a new process."""
        standby, self._standby = self._standby, None
        if standby is not None and standby.returncode is None and standby.stdin is not None:
            standby.stdin.write(json.dumps(argv).encode() + b"\n")
            with contextlib.suppress(ConnectionError):
                await standby.stdin.drain()
                standby.stdin.close()
                return standby, True
        cmd = [sys.executable, "-m", "kiln_runtimes", *argv]
        return await asyncio.create_subprocess_exec(*cmd, env=self._env), False

    async def _refill(self) -> None:
        """Start a standby worker unless one is alive (or standbys are off)."""
        if self._stopping or not self._settings.warm_standby:
            return
        if self._standby is not None and self._standby.returncode is None:
            return
        self._standby = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "kiln_runtimes", "--standby", stdin=asyncio.subprocess.PIPE,
            env=self._env,
        )  # fmt: skip
        log.info("standby worker started", pid=self._standby.pid)

    def suspect(self, worker: PoolWorker) -> None:
        """Take a worker out of rotation after a failed call; put it back if it answers again."""
        if not worker.ready:
            return
        self._set_ready(worker, False)
        if worker.process is not None and worker.process.returncode is None:
            deadline = time.monotonic() + self._settings.worker_start_timeout_s
            self._rechecks.add(asyncio.create_task(self._watch_ready(worker, deadline)))
            self._rechecks = {t for t in self._rechecks if not t.done()}

    def _set_ready(self, worker: PoolWorker, ready: bool) -> None:
        if worker.ready != ready:
            worker.ready = ready
            self.on_change(worker)

    async def _watch_ready(self, worker: PoolWorker, deadline: float) -> None:
        while time.monotonic() < deadline:
            info = await backend.health(self._http, worker)
            if info is not None and info.ready:
                worker.info = info
                self._set_ready(worker, True)
                log.info("worker ready", model=worker.spec.model, port=worker.port)
                await self._refill()
                return
            await asyncio.sleep(0.02)
        log.error("worker did not become ready in time; restarting", model=worker.spec.model)
        if worker.process is not None:
            worker.process.kill()

    async def _terminate(self, worker: PoolWorker) -> None:
        proc = worker.process
        if proc is None or proc.returncode is not None:
            return
        proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), timeout=30)
        except TimeoutError:
            proc.kill()
            await proc.wait()
