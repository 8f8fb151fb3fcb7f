"""The ``kubernetes`` pool backend: one Deployment per pool, its pods the pool's workers.

The pool manager still decides each pool's size; ``scale`` records it and the backend's one
background loop patches the Deployment's ``spec.replicas`` (the pool manager is the only writer:
do not also apply a KEDA ScaledObject to these Deployments). The Deployments are the desired
state and outlive the gateway that made them: a gateway that stops, or a fleet leader that
steps down (``step_down``), leaves them as they are, and the next one adopts them (found by
Kiln's labels; ``_kube_objects.adoption``), changing only their replicas unless its pod
template differs. Once the pool manager has reconciled with the registry (``reconciled``), the
Deployments it found that no pool wants (pools retired while no leader ran, or a removal the
last leader left pending) are deleted, if not younger than a grace (``_kube_objects.orphans``).
The same loop lists the worker
pods of every pool by label, about once a second, and keeps each pool's workers: a pod is a
worker the scheduler may use when its Ready condition is true, it has an IP, and the gateway's
own ``GET /health`` on ``http://<podIP>:9000`` answered ready (once when it turns Ready, and
again after ``suspect``). The Deployment's pure parts are in ``pools._kube_objects``.

The API client is lightkube (in-cluster service account, else ``$KUBECONFIG`` or
``~/.kube/config``), imported only here: the ``local`` backend never needs it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from typing import TYPE_CHECKING, Any, cast

import structlog
from lightkube import AsyncClient, KubeConfig
from lightkube.core.exceptions import ApiError
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.core_v1 import Pod
from lightkube.types import PatchType

from kiln_platform.pools import _kube_objects as objects
from kiln_platform.pools import backend
from kiln_platform.pools.backend import PoolSpec, PoolWorker

if TYPE_CHECKING:
    from collections.abc import Callable

    import aiohttp

    from kiln_platform.settings import Settings

log = structlog.get_logger("kiln.pools")
_FIELD_MANAGER = "kiln"


def check_store(settings: Settings, ismount: Callable[[str], bool] = os.path.ismount) -> None:
    """Refuse to start where worker pods (and the other gateways) cannot read what this gateway
    stores: without ``KILN_ARTIFACT_STORE`` the store is the claim, which pods mount at
    ``$KILN_DATA_DIR/store``, so the gateway must have it mounted there too (else models land
    on the pod's own disk and every worker fails to load them)."""
    if settings.artifact_store or ismount(str(settings.store_dir)):
        return
    shared = " (and, with KILN_SHARED_WORKERS=true, no other gateway)"
    shared = shared if settings.shared_workers else ""
    raise ValueError(
        f"KILN_KUBERNETES_STORE_CLAIM={settings.kubernetes_store_claim} is not mounted at "
        f"KILN_DATA_DIR/store ({settings.store_dir}): models stored here would be on this pod's "
        f"own disk, where no worker pod{shared} reads them. Mount the claim (ReadWriteMany) "
        "there in every gateway, or set KILN_ARTIFACT_STORE=s3://bucket/prefix"
    )


class KubernetesPoolBackend:
    """Keeps one Deployment per pool at the pool manager's size and tracks its pods."""

    workers_outlive_gateway = True
    """Pods serve on after this gateway stops (``pools.fleet`` keeps their rows)."""

    def __init__(
        self,
        settings: Settings,
        http: aiohttp.ClientSession,
        config: KubeConfig | None = None,
        *,
        poll_s: float = 1.0,
        port: int = objects.WORKER_PORT,
        orphan_grace_s: float = objects.ORPHAN_GRACE_S,
    ) -> None:
        """``config``: the API server to use (default: in-cluster, else the kubeconfig);
        ``port``: where workers listen (tests point it at a stand-in); ``orphan_grace_s``: the
        age below which a Deployment no pool wants is kept (``_kube_objects.orphans``)."""
        self._settings = settings
        self._http = http
        self._client = AsyncClient(
            config or KubeConfig.from_env(),
            namespace=settings.kubernetes_namespace,
            field_manager=_FIELD_MANAGER,
        )
        self._poll_s = poll_s
        self._port = port
        self._orphan_grace_s = orphan_grace_s
        self.pools: dict[str, list[PoolWorker]] = {}
        """Each pool's workers (by ``PoolSpec.key``): its pods, then placeholders for pods the
        Deployment has not made yet, as many as the pool's replicas."""
        self.specs: dict[str, PoolSpec] = {}
        self.on_change: Callable[[PoolWorker], None] = lambda worker: None
        """Called when a worker becomes ready or stops being ready."""
        self._replicas: dict[str, int] = {}
        self._applied: dict[str, int] = {}
        """Replicas last written to each pool's Deployment (absent: not created yet)."""
        self._pods: dict[str, PoolWorker] = {}
        """Every tracked pod's worker, by pod name (the same object while the pod lives)."""
        self._crashed: set[str] = set()
        self._doomed: set[str] = set()
        """Deployments of removed pools still to delete."""
        self._found: dict[str, dict[str, Any]] | None = None
        """Kiln's Deployments as this term's first sync found them (None: not listed yet),
        less those deleted since."""
        self._settled = False
        """The pool manager reconciled in this term: ``specs`` is every pool it wants."""
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def ensure(self, spec: PoolSpec) -> None:
        """Have a pool for ``spec``: its Deployment is created (or adopted) on the next sync."""
        self.specs.setdefault(spec.key, spec)
        self.pools.setdefault(spec.key, [])
        self._doomed.discard(objects.deployment_name(spec))
        self._kick()

    def remove(self, key: str) -> None:
        """Retire a pool: its workers leave rotation now; its Deployment is deleted (the pods
        get SIGTERM and drain)."""
        spec = self.specs.pop(key, None)
        for worker in self.pools.pop(key, []):
            self._set_ready(worker, False)
        self._replicas.pop(key, None)
        self._applied.pop(key, None)
        self._crashed.discard(key)
        if spec is not None:
            self._doomed.add(objects.deployment_name(spec))
            self._kick()

    def scale(self, key: str, replicas: int) -> None:
        """Have ``replicas`` workers: the pool's list changes now (a scale-down takes starting
        workers out first), the Deployment on the next sync, at once."""
        self._replicas[key] = replicas
        workers = self.pools.setdefault(key, [])
        while len(workers) < replicas:
            workers.append(PoolWorker(self.specs[key], self._port, started_at=time.monotonic()))
        while len(workers) > replicas:
            idle = [w for w in workers if not w.ready]
            worker = idle[-1] if idle else workers[-1]
            workers.remove(worker)
            self._set_ready(worker, False)
        self._kick()

    def reconciled(self) -> None:
        """Every pool the registry serves is ensured: from the next sync on, the Deployments
        this term found that no pool wants are deleted (their pods get SIGTERM and drain)."""
        if not self._settled:
            self._settled = True
            self._kick()

    def ready(self, key: str) -> list[PoolWorker]:
        """The pool's workers that take requests."""
        return [w for w in self.pools.get(key, []) if w.ready]

    def find(self, key: str, url: str) -> PoolWorker | None:
        """The pool's worker at ``url``, if it is still there."""
        return next((w for w in self.pools.get(key, []) if w.name and w.url == url), None)

    def draining(self, key: str) -> int:
        """Always 0: a terminating pod drains under Kubernetes, outside the pool's list."""
        return 0

    def crashed(self, key: str) -> bool:
        """The pool has all its pods, every one crash-looping or failed, none ready (a pod
        not made yet may still start)."""
        return key in self._crashed and not self.ready(key)

    def suspect(self, worker: PoolWorker) -> None:
        """Out of rotation after a failed call, until its next ``GET /health`` answers ready
        (the next sync, while its pod is Ready)."""
        self._set_ready(worker, False)

    def credits(self, worker: PoolWorker | None) -> int:
        """Requests the scheduler may keep in flight on ``worker`` (``backend.credits``)."""
        return backend.credits(self._settings, worker)

    def retry_after(self, worker: PoolWorker) -> float:
        """Seconds a caller should wait for this worker to become ready (a rough estimate)."""
        return backend.retry_after(self._settings, worker)

    def step_down(self) -> None:
        """Stop managing the pools (a fleet leader stepping down): their workers leave this
        gateway's rotation; their Deployments stay as they are, neither resized nor deleted from
        here again, for the next leader to adopt (the pods serve through the hand-over)."""
        for workers in self.pools.values():
            for worker in workers:
                self._set_ready(worker, False)
        for state in (self.specs, self.pools, self._replicas, self._applied, self._pods):
            state.clear()
        self._crashed.clear()
        self._doomed.clear()  # the next leader deletes them: no pool of its wants them
        self._found = None
        self._settled = False
        task, self._task = self._task, None
        if task is not None:
            task.cancel()

    async def stop(self) -> None:
        """Stop syncing. Deployments stay as they are: workers keep serving through a gateway
        restart, and the next gateway adopts them."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._client.close()

    def _kick(self) -> None:
        self._wake.set()
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="pools:kubernetes")

    async def _loop(self) -> None:
        while True:
            self._wake.clear()
            try:
                await self.sync()
            except Exception:  # the next round tries again
                log.exception("kubernetes pool sync failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._poll_s)

    async def sync(self) -> None:
        """One round: delete removed pools' Deployments (and, once reconciled, those no pool
        wants), create or resize the others, then read every pool's pods."""
        if self._found is None:  # a new term: what a previous leader (or gateway) left
            listed = self._client.list(Deployment, labels=dict(objects.WORKER_SELECTOR))
            self._found = {
                d.metadata.name: d.to_dict() async for d in listed if d.metadata and d.metadata.name
            }
        for name in list(self._doomed):
            if await self._delete(name):
                self._doomed.discard(name)
        if self._settled:
            desired = {objects.deployment_name(spec) for spec in self.specs.values()}
            for name in objects.orphans(desired, self._found, time.time(), self._orphan_grace_s):
                if await self._delete(name):
                    log.info("orphaned pool deployment deleted", deployment=name)
        for key, spec in list(self.specs.items()):
            replicas = self._replicas.get(key, 0)
            if self._applied.get(key) != replicas:
                await self._apply(spec, replicas)
                self._applied[key] = replicas
        pods = [
            pod.to_dict()
            async for pod in self._client.list(Pod, labels=dict(objects.WORKER_SELECTOR))
        ]
        await self._observe([p for p in pods if isinstance(p, dict)])

    async def _delete(self, name: str) -> bool:
        """Delete a Deployment (its pods get SIGTERM and drain); already gone is the same.
        False on any other error: the next round tries again, and the pools still sync."""
        try:
            await self._client.delete(Deployment, name)
        except ApiError as exc:
            if exc.status.code != 404:
                log.warning("pool deployment not deleted", deployment=name, error=str(exc))
                return False
        if self._found is not None:
            self._found.pop(name, None)  # made anew if the pool comes back
        return True

    async def _apply(self, spec: PoolSpec, replicas: int) -> None:
        """Create the pool's Deployment, or adopt it if it exists (a previous leader's or
        gateway's: ``objects.adoption``); later changes patch the size only."""
        name = objects.deployment_name(spec)
        if spec.key in self._applied:
            patch = {"spec": {"replicas": replicas}}
            await self._client.patch(Deployment, name, patch, patch_type=PatchType.MERGE)
            log.info("pool deployment scaled", pool=spec.key, deployment=name, replicas=replicas)
            return
        body = objects.deployment(spec, self._settings, replicas)
        found: dict[str, Any] | None = (self._found or {}).get(name)
        if found is None:
            try:
                await self._client.create(cast("Deployment", Deployment.from_dict(body)))
                log.info("pool deployment created", pool=spec.key, deployment=name,
                         replicas=replicas)  # fmt: skip
                return
            except ApiError as exc:  # made since the list, or without Kiln's labels
                if exc.status.code != 409:
                    raise
                found = (await self._client.get(Deployment, name)).to_dict()
        change = objects.adoption(found, body)
        if change is not None:
            await self._client.patch(Deployment, name, change, patch_type=PatchType.MERGE)
        log.info("pool deployment adopted", pool=spec.key, deployment=name, replicas=replicas,
                 template_updated=change is not None and "metadata" in change)  # fmt: skip

    async def _observe(self, pods: list[dict[str, Any]]) -> None:
        """Rebuild each pool's workers from its pods; health-check the pods that turned Ready."""
        by_pool: dict[str, list[objects.PodState]] = {}
        for pod in pods:
            pool = ((pod.get("metadata") or {}).get("labels") or {}).get(objects.POOL_LABEL)
            by_pool.setdefault(pool or "", []).append(objects.pod_state(pod))
        seen: dict[str, PoolWorker] = {}
        checks: list[PoolWorker] = []
        for key, spec in self.specs.items():
            states = by_pool.get(objects.deployment_name(spec), [])
            live = [s for s in states if not s.terminating]
            wanted = self._replicas.get(key, 0)
            if live and len(live) >= wanted and all(s.crashed for s in live):
                self._crashed.add(key)
            else:
                self._crashed.discard(key)
            workers = []
            for state in objects.keep(states, wanted):
                worker = self._worker(spec, state)
                seen[state.name] = worker
                workers.append(worker)
                if not (state.ready and state.ip):
                    self._set_ready(worker, False)
                elif not worker.ready:
                    checks.append(worker)
            placeholders = [w for w in self.pools.get(key, []) if not w.name]
            missing = wanted - len(workers)
            self.pools[key] = (
                workers
                + placeholders[:missing]
                + [
                    PoolWorker(spec, self._port, started_at=time.monotonic())
                    for _ in range(missing - len(placeholders[:missing]))
                ]
            )
        for name, worker in self._pods.items():
            if name not in seen:  # terminating, gone, or beyond the pool's size
                self._set_ready(worker, False)
        self._pods = seen
        await asyncio.gather(*(self._check(w) for w in checks))

    def _worker(self, spec: PoolSpec, state: objects.PodState) -> PoolWorker:
        worker = self._pods.get(state.name)
        if worker is None:
            started = time.monotonic() - max(0.0, time.time() - state.created_at)
            worker = PoolWorker(spec, self._port, name=state.name, started_at=started)
        worker.host = state.ip or ""
        worker.restarts = state.restarts
        return worker

    async def _check(self, worker: PoolWorker) -> None:
        info = await backend.health(self._http, worker)
        if info is not None and info.ready and worker.name in self._pods:
            worker.info = info
            self._set_ready(worker, True)
            log.info("worker ready", model=worker.spec.model, pod=worker.name, url=worker.url)

    def _set_ready(self, worker: PoolWorker, ready: bool) -> None:
        if worker.ready != ready:
            worker.ready = ready
            self.on_change(worker)
