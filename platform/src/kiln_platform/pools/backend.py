"""What the pool manager asks of a pool backend (``local`` or ``kubernetes``) and what both
share: a pool's spec, a worker as the router sees it, the worker's command line.

A backend owns a set of pools (by ``PoolSpec.key``), each a list of workers, and makes each pool
as big as the manager's last ``scale``; it reports workers becoming ready or leaving rotation
through ``on_change``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Protocol

import aiohttp
import msgspec

from kiln_platform.registry.engine import EngineSettings
from kiln_platform.scheduler.runner import EXPRESS_CREDITS
from kiln_platform.subprocess_env import child_environment
from kiln_runtimes.protocol import WORKER_SECRET_ENV, WorkerInfo
from kiln_runtimes.store import CACHE_MAX_ENV, STORE_ENV

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from pathlib import Path

    from kiln_platform.settings import Settings

BACKGROUND = "+batch"
"""What a background twin's key and version label add to its version's."""


@dataclass(frozen=True, slots=True)
class PoolSpec:
    """What a pool runs: one model version from a built folder, with its engine settings."""

    model: str
    version: str
    model_dir: Path
    engine: EngineSettings = field(default_factory=EngineSettings)
    """The version's own settings; each unset field is the deployment's ``KILN_WORKER_*``."""
    idle: bool = False
    """Its workers run at idle CPU priority (``--idle``, ``SCHED_IDLE``): a shadow candidate's
    and a background twin's, whose work takes only the cores served work leaves idle."""
    background: bool = False
    """The background twin of the version's pool: it runs the version's batch-class work
    (``PoolManager.route``), at idle priority."""

    @property
    def label(self) -> str:
        """The version as metrics and the fleet view name the pool: ``3``, its twin ``3+batch``."""
        return f"{self.version}{BACKGROUND}" if self.background else self.version

    @property
    def key(self) -> str:
        """The pool's name: ``model@version`` (a model has a pool per served version, and may
        have a background twin, ``model@version+batch``)."""
        return f"{self.model}@{self.label}"

    def twin(self) -> PoolSpec:
        """The spec of this pool's background twin: the same version at idle priority."""
        return replace(self, idle=True, background=True)


@dataclass(frozen=True, slots=True)
class PoolSize:
    """A pool's version and workers: as the policy decided (what KEDA would scale to), running
    (started, ready or not), ready, and draining (out of the pool, finishing their work)."""

    spec: PoolSpec
    desired: int
    running: int
    ready: int
    draining: int = 0


@dataclass(slots=True)
class PoolWorker:
    """A pool's record of one worker (a local process or a pod) and what its backend knows of
    it; the process itself is a runtime ``Worker`` (``kiln_runtimes``)."""

    spec: PoolSpec
    port: int = 0
    host: str = "127.0.0.1"
    """Where the worker listens: loopback for a local process, the pod IP for a pod."""
    name: str = ""
    """The pod's name (``kubernetes``); empty for a process or a pod not created yet."""
    process: asyncio.subprocess.Process | None = None
    ready: bool = False
    restarts: int = 0
    started_at: float = 0.0
    info: WorkerInfo | None = None
    task: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        """Base URL of the worker's internal HTTP server."""
        return f"http://{self.host}:{self.port}"


class PoolBackend(Protocol):
    """The pool backend interface ``PoolManager`` drives (``LocalPoolBackend``,
    ``KubernetesPoolBackend``)."""

    pools: dict[str, list[PoolWorker]]
    specs: dict[str, PoolSpec]
    on_change: Callable[[PoolWorker], None]
    workers_outlive_gateway: bool
    """Its workers go on serving after this gateway stops (pods, not child processes)."""

    def ensure(self, spec: PoolSpec) -> None:
        """Have a pool for ``spec`` (empty until ``scale``)."""

    def remove(self, key: str) -> None:
        """Retire a pool: its workers leave rotation and drain."""

    def scale(self, key: str, replicas: int) -> None:
        """Make the pool ``replicas`` workers big."""

    def step_down(self) -> None:
        """Stop managing every pool (a fleet leader stepping down): workers that are this
        gateway's own stop; what outlives it (Deployments) stays for the next leader."""

    def reconciled(self) -> None:
        """The pool manager has ensured every pool the registry serves (a reconcile ended): what
        outlives a gateway (Deployments) and no pool wants may be deleted."""

    def ready(self, key: str) -> list[PoolWorker]:
        """The pool's workers that take requests."""
        ...

    def find(self, key: str, url: str) -> PoolWorker | None:
        """The pool's worker at ``url``, if it is still there."""

    def draining(self, key: str) -> int:
        """Workers taken out of the pool that have not exited yet."""
        ...

    def crashed(self, key: str) -> bool:
        """Every worker of a non-empty pool is down after a crash."""
        ...

    def suspect(self, worker: PoolWorker) -> None:
        """Out of rotation after a failed call, until its next successful readiness check."""

    def credits(self, worker: PoolWorker | None) -> int:
        """Requests the scheduler may keep in flight on ``worker``."""
        ...

    def retry_after(self, worker: PoolWorker) -> float:
        """Seconds a caller should wait for this worker to become ready."""
        ...

    async def stop(self) -> None:
        """Stop supervising (and, for local processes, stop them)."""


def worker_arguments(
    spec: PoolSpec, settings: Settings, port: int, host: str | None = None
) -> list[str]:
    """The worker's command line after ``python -m kiln_runtimes``: the version's engine
    settings (``spec.engine``) over the deployment's defaults."""
    s, e = settings, spec.engine
    cmd = [
        "--model-dir", str(spec.model_dir),
        "--model", spec.model,
        "--version", spec.version,
        "--port", str(port),
        "--max-batch-size", str(e.max_batch_size or s.worker_max_batch_size),
        "--max-wait-ms", str(s.worker_max_wait_ms),
        "--max-queue", str(s.worker_max_queue),
        "--log-level", s.log_level,
        "--target", e.target or s.worker_target,
        "--precision", e.precision or s.worker_precision,
    ]  # fmt: skip
    if host is not None:
        cmd += ["--host", host]
    if spec.idle:
        cmd += ["--idle"]
    if s.worker_threads:
        cmd += ["--threads", str(s.worker_threads)]
    if s.worker_concurrency != 1:
        cmd += ["--concurrency", str(s.worker_concurrency)]
    if s.worker_prefetch:
        cmd += ["--prefetch"]
    if s.worker_cpus:
        cmd += ["--cpus", s.worker_cpus]
    if s.shared_workers:  # gateways share it: it enforces its own limit (``busy``)
        slots = s.worker_slots or e.max_batch_size or s.worker_max_batch_size
        cmd += ["--slots", str(slots + EXPRESS_CREDITS)]
    if not s.worker_preempt:
        cmd += ["--no-preempt"]
    if not s.worker_express_runner:
        cmd += ["--no-express-runner"]
    if not s.worker_adaptive_wait or spec.background:  # a twin's lines gain nothing by haste
        cmd += ["--fixed-wait"]
    slots = s.worker_adapter_slots if e.adapter_slots is None else e.adapter_slots
    if slots:
        cmd += ["--adapter-slots", str(slots)]
        cmd += ["--adapter-rank", str(s.worker_adapter_rank)]
    cmd += ["--decoding-prefill", str(s.worker_decoding_prefill)]
    return [*cmd, "--prefix-cache-mb", str(s.worker_prefix_cache_mb)]


def worker_headers(settings: Settings) -> dict[str, str]:
    """Headers of every gateway->worker call (the HTTP session for workers sends them all):
    the worker secret, without which a worker answers 401 (``kiln_runtimes.protocol``)."""
    return {"authorization": f"Bearer {settings.worker_key()}"}


def worker_environment(settings: Settings, parent: Mapping[str, str]) -> dict[str, str]:
    """A local worker's environment: the allowed part of ``parent`` and the worker secret; with
    an ``s3://`` store, that store and the ``AWS_*`` settings to read it with."""
    extra = {WORKER_SECRET_ENV: settings.worker_key()}
    if settings.artifact_store:
        extra |= {k: v for k, v in parent.items() if k.startswith("AWS_")}
        extra |= {STORE_ENV: settings.artifact_store,
                  CACHE_MAX_ENV: str(settings.artifact_cache_max_bytes)}  # fmt: skip
    return child_environment(parent, **extra)


def credits(settings: Settings, worker: PoolWorker | None) -> int:
    """Requests the scheduler may keep in flight on ``worker`` (about one batch); for a worker
    not started yet (or not described yet), what one is expected to take."""
    if settings.worker_slots:
        return settings.worker_slots
    if worker is None or worker.info is None:
        return (
            settings.worker_max_batch_size
            if worker is None
            else (worker.spec.engine.max_batch_size or settings.worker_max_batch_size)
        )
    return worker.info.max_batch_size


def retry_after(settings: Settings, worker: PoolWorker) -> float:
    """Seconds a caller should wait for this worker to become ready (a rough estimate)."""
    waited = time.monotonic() - worker.started_at
    return max(1.0, min(settings.worker_start_timeout_s, 5.0 - waited))


async def health(http: aiohttp.ClientSession, worker: PoolWorker) -> WorkerInfo | None:
    """The worker's ``GET /health`` report, or None if it does not answer (1 s)."""
    failures = (aiohttp.ClientError, OSError, asyncio.TimeoutError, msgspec.DecodeError)
    with contextlib.suppress(*failures):
        async with http.get(f"{worker.url}/health", timeout=aiohttp.ClientTimeout(1)) as r:
            return msgspec.msgpack.decode(await r.read(), type=WorkerInfo)
    return None
