"""The ``kubernetes`` pool backend through the real client library (lightkube, real HTTP)
against a stand-in for the API server (``fake_kube_api``): Deployments created on ``ensure``,
replicas patched on ``scale``, pods turned into ready workers, ``suspect``, ``crashed``,
``remove``. PoolWorker pods' ``GET /health`` is served by the real worker routes
(``kiln_runtimes._app``) over a stub worker, on loopback addresses standing for pod IPs.

What only a real cluster shows (scheduling, probes, the controller's choices) is in the last
test, which runs only with ``KUBECONFIG`` and ``KILN_TEST_KUBE_NAMESPACE`` set.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import aiohttp
import pytest
from aiohttp import web
from lightkube import KubeConfig
from pydantic import SecretStr
from sqlalchemy import select

from kiln_platform.batches.runner import BatchRunner
from kiln_platform.context import running
from kiln_platform.db.database import Database
from kiln_platform.db.engine import writer_engine
from kiln_platform.gateway.metrics import RequestMetrics
from kiln_platform.pools import _kube_objects as objects
from kiln_platform.pools._kube_objects import deployment_name
from kiln_platform.pools.backend import PoolSpec, PoolWorker, worker_headers
from kiln_platform.pools.fleet import Fleet
from kiln_platform.pools.kubernetes import KubernetesPoolBackend, check_store
from kiln_platform.pools.leader import LeaderElector
from kiln_platform.pools.shared import SharedBackend
from kiln_platform.pools.tables import FleetReplica
from kiln_platform.settings import Settings
from kiln_runtimes import _app as worker_app
from kiln_runtimes.protocol import WorkerInfo

from .fake_kube_api import FakeKubeAPI, serving

SPEC = PoolSpec("resnet50", "1", Path("/data/store/trees/abc"))
NAME = deployment_name(SPEC)
SECRET = "kube-backend-test-worker-secret"
POD_IPS = ("127.0.0.2", "127.0.0.3")
"""Loopback addresses standing for pod IPs: the stub workers listen on both."""


@dataclass
class StubWorkers:
    """``GET /health`` of every pod IP in ``POD_IPS`` on one port; ``ready`` is their answer."""

    port: int = 0
    ready: bool = True
    seen: list[str] = field(default_factory=list)

    def info(self) -> WorkerInfo:
        return WorkerInfo(model="resnet50", version="1", task="tensor", ready=self.ready,
                          draining=False, in_flight=0, queued=0, free_slots=8,
                          max_batch_size=8, max_queue=64)  # fmt: skip


@pytest.fixture
async def workers() -> AsyncIterator[StubWorkers]:
    stub = StubWorkers()
    worker = SimpleNamespace(settings=SimpleNamespace(max_queue=64, secret=SECRET), info=stub.info,
                             manifest=SimpleNamespace(context_length=1, task="tensor"))  # fmt: skip
    runner = web.AppRunner(worker_app.create_app(worker))  # type: ignore[arg-type]
    await runner.setup()
    first = web.TCPSite(runner, POD_IPS[0], 0)
    await first.start()
    stub.port = runner.addresses[0][1]
    await web.TCPSite(runner, POD_IPS[1], stub.port).start()
    yield stub
    await runner.cleanup()


@pytest.fixture
async def kube() -> AsyncIterator[FakeKubeAPI]:
    async with serving() as api:
        yield api


@pytest.fixture
async def backend(
    kube: FakeKubeAPI, workers: StubWorkers, tmp_path: Path
) -> AsyncIterator[KubernetesPoolBackend]:
    settings = Settings(data_dir=tmp_path, pool_backend="kubernetes", worker_image="kiln/w:1",
                        kubernetes_store_claim="kiln-store",
                        worker_secret=SecretStr(SECRET))  # fmt: skip
    async with aiohttp.ClientSession(headers=worker_headers(settings)) as http:
        pools = KubernetesPoolBackend(settings, http, KubeConfig.from_dict(kube.kubeconfig()),
                                  poll_s=0.05, port=workers.port)  # fmt: skip
        yield pools
        await pools.stop()


async def until(check: Callable[[], object]) -> None:
    """Wait up to 5 s for ``check()`` to hold (the backend syncs every 50 ms here)."""
    deadline = time.monotonic() + 5.0
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


def replicas(kube: FakeKubeAPI) -> int | None:
    found = kube.deployments.get(NAME)
    return None if found is None else int(found["spec"]["replicas"])


async def sized(backend: KubernetesPoolBackend, kube: FakeKubeAPI, n: int) -> None:
    """The pool ensured and scaled to ``n``, its Deployment at ``n`` replicas."""
    backend.ensure(SPEC)
    backend.scale(SPEC.key, n)
    await until(lambda: replicas(kube) == n)


async def test_ensure_creates_the_deployment_and_scale_patches_its_replicas(
    backend: KubernetesPoolBackend, kube: FakeKubeAPI
) -> None:
    await sized(backend, kube, 1)
    created = kube.deployments[NAME]
    assert created["metadata"]["namespace"] == "kiln"
    assert created["spec"]["template"]["spec"]["containers"][0]["image"] == "kiln/w:1"
    assert ("POST", "/apis/apps/v1/namespaces/kiln/deployments", "application/json") in (
        kube.requests
    )
    assert len(backend.pools[SPEC.key]) == 1  # a placeholder until the pod exists
    assert backend.ready(SPEC.key) == []
    backend.scale(SPEC.key, 3)
    await until(lambda: replicas(kube) == 3)
    assert ("PATCH", f"/apis/apps/v1/namespaces/kiln/deployments/{NAME}",
            "application/merge-patch+json") in kube.requests  # fmt: skip
    backend.scale(SPEC.key, 0)  # to zero: the Deployment stays, with no pods
    await until(lambda: replicas(kube) == 0)
    assert backend.pools[SPEC.key] == []
    creates = [r for r in kube.requests if r[0] == "POST"]
    assert len(creates) == 1


async def test_ready_pods_with_an_ip_that_answer_health_are_the_workers(
    backend: KubernetesPoolBackend, kube: FakeKubeAPI, workers: StubWorkers
) -> None:
    changes: list[tuple[str, bool]] = []
    backend.on_change = lambda w: changes.append((w.name, w.ready))
    await sized(backend, kube, 2)
    kube.add_pod(NAME, "a", POD_IPS[0], ready=True)
    kube.add_pod(NAME, "b", POD_IPS[1], ready=False)
    await until(lambda: len(backend.ready(SPEC.key)) == 1)
    [a] = backend.ready(SPEC.key)
    assert (a.name, a.url) == ("a", f"http://{POD_IPS[0]}:{workers.port}")
    assert a.info is not None
    assert backend.credits(a) == 8
    assert backend.find(SPEC.key, a.url) is a
    assert [w.name for w in backend.pools[SPEC.key]] == ["a", "b"]
    kube.pods["b"]["status"]["conditions"][0]["status"] = "True"
    await until(lambda: len(backend.ready(SPEC.key)) == 2)
    kube.pods["a"]["metadata"]["deletionTimestamp"] = "2026-01-01T00:01:00Z"  # scaled away
    await until(lambda: [w.name for w in backend.ready(SPEC.key)] == ["b"])
    assert changes == [("a", True), ("b", True), ("a", False)]
    assert backend.find(SPEC.key, a.url) is None


async def test_a_ready_pod_whose_health_the_gateway_cannot_reach_is_not_used(
    backend: KubernetesPoolBackend, kube: FakeKubeAPI
) -> None:
    await sized(backend, kube, 1)
    kube.add_pod(NAME, "far", "127.0.0.9", ready=True)  # nothing listens there
    kube.add_pod(NAME, "no-ip", None, ready=True)
    await until(lambda: [w.name for w in backend.pools[SPEC.key]] == ["far"])
    await asyncio.sleep(0.3)
    assert backend.ready(SPEC.key) == []


async def test_a_pod_that_refuses_the_gateways_secret_is_not_used(
    backend: KubernetesPoolBackend, kube: FakeKubeAPI, workers: StubWorkers
) -> None:
    """The health check carries the worker secret; a worker with another secret answers 401,
    and its pod, Ready to the kubelet (whose probes need none), never takes requests."""
    other = SimpleNamespace(settings=SimpleNamespace(max_queue=64, secret="not-this-gateways"),
                            info=workers.info,
                            manifest=SimpleNamespace(context_length=1, task="tensor"))  # fmt: skip
    runner = web.AppRunner(worker_app.create_app(other))  # type: ignore[arg-type]
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.4", workers.port).start()
    try:
        await sized(backend, kube, 2)
        kube.add_pod(NAME, "other", "127.0.0.4", ready=True)
        kube.add_pod(NAME, "ours", POD_IPS[0], ready=True)
        await until(lambda: [w.name for w in backend.ready(SPEC.key)] == ["ours"])
        await asyncio.sleep(0.3)
        assert [w.name for w in backend.ready(SPEC.key)] == ["ours"]
        assert sorted(w.name for w in backend.pools[SPEC.key]) == ["other", "ours"]
    finally:
        await runner.cleanup()


async def test_suspect_takes_a_worker_out_until_its_health_answers_ready_again(
    backend: KubernetesPoolBackend, kube: FakeKubeAPI, workers: StubWorkers
) -> None:
    await sized(backend, kube, 1)
    kube.add_pod(NAME, "a", POD_IPS[0])
    await until(lambda: len(backend.ready(SPEC.key)) == 1)
    [worker] = backend.ready(SPEC.key)
    workers.ready = False  # the gateway cannot use it, though its pod is still Ready
    backend.suspect(worker)
    assert backend.ready(SPEC.key) == []
    await asyncio.sleep(0.3)  # several syncs: the pod is Ready, its health says no
    assert backend.ready(SPEC.key) == []
    workers.ready = True
    await until(lambda: backend.ready(SPEC.key) == [worker])


async def test_crashed_is_every_pod_crash_looping_with_none_ready(
    backend: KubernetesPoolBackend, kube: FakeKubeAPI
) -> None:
    await sized(backend, kube, 2)
    kube.add_pod(NAME, "a", POD_IPS[0], ready=False, waiting="CrashLoopBackOff")
    await asyncio.sleep(0.2)
    assert not backend.crashed(SPEC.key)  # the other pod may still start
    kube.add_pod(NAME, "b", POD_IPS[1], ready=False, waiting="ErrImagePull")
    await until(lambda: backend.crashed(SPEC.key))
    worker = backend.pools[SPEC.key][0]
    assert 1.0 <= backend.retry_after(worker) <= 5.0
    kube.pods["b"]["status"]["conditions"][0]["status"] = "True"
    kube.pods["b"]["status"]["containerStatuses"][0]["state"] = {"running": {}}
    await until(lambda: not backend.crashed(SPEC.key))
    # ready once the gateway's own health check of the pod passes, a poll after it turns Ready
    await until(lambda: [w.name for w in backend.ready(SPEC.key)] == ["b"])


async def test_remove_deletes_the_deployment_and_takes_its_workers_out(
    backend: KubernetesPoolBackend, kube: FakeKubeAPI
) -> None:
    await sized(backend, kube, 1)
    kube.add_pod(NAME, "a", POD_IPS[0])
    await until(lambda: len(backend.ready(SPEC.key)) == 1)
    [worker] = backend.ready(SPEC.key)
    backend.remove(SPEC.key)
    assert not worker.ready
    await until(lambda: NAME not in kube.deployments)
    assert SPEC.key not in backend.pools


async def test_an_existing_deployment_is_adopted_with_our_template_and_size(
    backend: KubernetesPoolBackend, kube: FakeKubeAPI
) -> None:
    """Without Kiln's labels the list does not find it: the create's conflict does."""
    kube.deployments[NAME] = {"apiVersion": "apps/v1", "kind": "Deployment",
                              "metadata": {"name": NAME, "namespace": "kiln"},
                              "spec": {"replicas": 5, "selector": {"matchLabels": {"a": "b"}},
                                       "template": {"spec": {"containers": [
                                           {"name": "worker", "image": "old"}]}}}}  # fmt: skip
    await sized(backend, kube, 1)
    assert kube.deployments[NAME]["spec"]["template"]["spec"]["containers"][0]["image"] == (
        "kiln/w:1"
    )


async def test_a_leader_hand_over_keeps_the_deployments_and_their_pods(
    kube: FakeKubeAPI, workers: StubWorkers, tmp_path: Path
) -> None:
    """Two gateways of a shared fleet: the leader steps down and leaves its Deployment as it is
    (no delete, no more writes); the next adopts it by Kiln's labels without a create or a
    template patch, serves the same pods, and from then on patches only the replicas."""
    settings = Settings(data_dir=tmp_path, pool_backend="kubernetes", worker_image="kiln/w:1",
                        kubernetes_store_claim="kiln-store", worker_secret=SecretStr(SECRET),
                        shared_workers=True)  # fmt: skip
    config = KubeConfig.from_dict(kube.kubeconfig())
    async with aiohttp.ClientSession(headers=worker_headers(settings)) as http:
        a, b = (
            SharedBackend(KubernetesPoolBackend(settings, http, config, poll_s=0.05, port=port))
            for port in (workers.port, workers.port)
        )
        try:
            for shared in (a, b):
                shared.own = {SPEC.key: 2}
                shared.ensure(SPEC)
            a.lead(True)
            await until(lambda: replicas(kube) == 2)
            kube.add_pod(NAME, "p0", POD_IPS[0])
            kube.add_pod(NAME, "p1", POD_IPS[1])
            await until(lambda: len(a.ready(SPEC.key)) == 2)
            urls = sorted(w.url for w in a.ready(SPEC.key))
            template = kube.deployments[NAME]["spec"]["template"]
            a.lead(False)
            assert a.ready(SPEC.key) == []
            seen = len(kube.requests)
            await asyncio.sleep(0.3)  # the old leader neither syncs nor writes any more
            assert kube.requests[seen:] == []
            b.lead(True)
            await until(lambda: len(b.ready(SPEC.key)) == 2)
            assert sorted(w.url for w in b.ready(SPEC.key)) == urls
            b.own = {SPEC.key: 3}
            b.apply()
            await until(lambda: replicas(kube) == 3)
            assert kube.deployments[NAME]["spec"]["template"] == template
            writes = [(m, p) for m, p, _ in kube.requests[seen:] if m in ("POST", "DELETE")]
            assert writes == []
            assert [m for m, _, _ in kube.requests[seen:]].count("PATCH") == 1
            b.remove(SPEC.key)  # an adopted pool retired, then served again: made anew
            await until(lambda: NAME not in kube.deployments)
            b.ensure(SPEC)
            b.apply()
            await until(lambda: replicas(kube) == 3)
        finally:
            for shared in (a, b):
                await shared.stop()
    assert NAME in kube.deployments  # a gateway's stop leaves them too


async def test_a_new_leader_deletes_the_deployments_no_pool_wants_once_reconciled(
    kube: FakeKubeAPI, workers: StubWorkers, tmp_path: Path
) -> None:
    """A hand-over while a pool is retired: the old leader's removal is still pending when it
    steps down (its Deployment stays). The new leader deletes nothing until the pool manager
    has reconciled (it may not know every pool yet); then the retired pool's Deployment goes
    and the wanted one stays untouched. A Deployment younger than the grace (a pool the old
    leader may just have made) waits out the grace first."""
    settings = Settings(data_dir=tmp_path, pool_backend="kubernetes", worker_image="kiln/w:1",
                        kubernetes_store_claim="kiln-store", worker_secret=SecretStr(SECRET),
                        shared_workers=True)  # fmt: skip
    config = KubeConfig.from_dict(kube.kubeconfig())
    retired = PoolSpec("resnet50", "2", Path("/data/store/trees/def"))
    async with aiohttp.ClientSession(headers=worker_headers(settings)) as http:
        a, b = (
            SharedBackend(KubernetesPoolBackend(settings, http, config, poll_s=0.05,
                                                port=workers.port, orphan_grace_s=2.0))
            for _ in range(2)
        )  # fmt: skip
        try:
            a.own = {SPEC.key: 1, retired.key: 1}
            for spec in (SPEC, retired):
                a.ensure(spec)
            a.lead(True)
            await until(lambda: deployment_name(retired) in kube.deployments and replicas(kube))
            a.reconciled()  # its registry read: both wanted, nothing to delete
            await asyncio.sleep(0.2)
            assert {NAME, deployment_name(retired)} <= set(kube.deployments)
            a.remove(retired.key)  # retired, and the leader steps down before its next sync
            a.lead(False)
            assert deployment_name(retired) in kube.deployments
            now = datetime.now(UTC).isoformat().replace("+00:00", "Z")
            meta = {"name": "kiln-pool-young-1", "labels": objects.selector(retired),
                    "creationTimestamp": now}  # fmt: skip
            kube.deployments["kiln-pool-young-1"] = dict(kube.deployments[NAME], metadata=meta)
            seen = len(kube.requests)
            b.own = {SPEC.key: 1}
            b.ensure(SPEC)  # its registry no longer serves the retired version
            b.lead(True)
            await asyncio.sleep(0.3)  # not reconciled yet: the new leader deletes nothing
            assert {NAME, deployment_name(retired), "kiln-pool-young-1"} <= set(kube.deployments)
            b.reconciled()
            await until(lambda: deployment_name(retired) not in kube.deployments)
            assert "kiln-pool-young-1" in kube.deployments  # younger than the grace: kept
            await until(lambda: "kiln-pool-young-1" not in kube.deployments)
            assert replicas(kube) == 1
            writes = [(m, p.rsplit("/", 1)[-1]) for m, p, _ in kube.requests[seen:]
                      if m in ("POST", "PATCH", "DELETE")]  # fmt: skip
            assert sorted(writes) == [
                ("DELETE", deployment_name(retired)), ("DELETE", "kiln-pool-young-1")
            ]  # fmt: skip
        finally:
            for shared in (a, b):
                await shared.stop()


@pytest.mark.integration
async def test_a_fleet_hand_over_keeps_the_pods_registered_throughout(
    db: Database, kube: FakeKubeAPI, workers: StubWorkers, tmp_path: Path
) -> None:
    """Two gateways' fleet parts on PostgreSQL, each with the kubernetes backend: the leader
    registers its pods (pod IP, port 9000 here the stub's); it stops, and its rows stay (pods
    outlive it); the next leader's first beat leaves them while it checks the adopted pods (here
    not passed yet: registering only checked pods would empty the registry), and its next
    registers the same pods as its own."""
    settings = Settings(data_dir=tmp_path, pool_backend="kubernetes", worker_image="kiln/w:1",
                        kubernetes_store_claim="kiln-store", worker_secret=SecretStr(SECRET),
                        shared_workers=True)  # fmt: skip
    config = KubeConfig.from_dict(kube.kubeconfig())

    async def rows() -> list[tuple[str, uuid.UUID]]:
        async with db.sessions() as session:
            found = await session.execute(select(FleetReplica.url, FleetReplica.gateway_id))
            return sorted((url, gateway) for url, gateway in found.all())

    async with aiohttp.ClientSession(headers=worker_headers(settings)) as http:
        fleets = []
        for _ in range(2):
            shared = SharedBackend(KubernetesPoolBackend(settings, http, config, poll_s=0.05,
                                                         port=workers.port))  # fmt: skip
            shared.own = {SPEC.key: 2}
            shared.ensure(SPEC)
            lock_db = writer_engine(db.engine, db.set_role)
            fleets.append(Fleet(db.sessions, LeaderElector(lock_db, "gw", retry_s=0.2), shared,
                                lock_db))  # fmt: skip
        a, b = fleets
        try:
            await a.beat()
            await until(lambda: replicas(kube) == 2)
            kube.add_pod(NAME, "p0", POD_IPS[0])
            kube.add_pod(NAME, "p1", POD_IPS[1])
            await until(lambda: len(a._backend.ready(SPEC.key)) == 2)
            await a.beat()
            urls = sorted(f"http://{ip}:{workers.port}" for ip in POD_IPS)
            assert await rows() == [(url, a.id) for url in urls]
            await a.stop()
            workers.ready = False  # the new leader's check of the pods has not passed yet
            await b.beat()
            assert b.elector.leader
            assert await rows() == [(url, a.id) for url in urls]  # the pods still serve
            workers.ready = True
            await until(lambda: len(b._backend.ready(SPEC.key)) == 2)
            await b.beat()
            assert await rows() == [(url, b.id) for url in urls]
            assert replicas(kube) == 2
            assert not [r for r in kube.requests if r[0] == "DELETE"]
        finally:
            await b.stop()
            for fleet in fleets:
                await fleet._backend.stop()


async def test_a_gateway_whose_store_is_not_the_claim_refuses_to_start(
    database_uri: str, tmp_path: Path
) -> None:
    """Without an s3 store, the claim the pods mount at ``$KILN_DATA_DIR/store`` must be
    mounted there in the gateway: else it stores models where no pod and no other gateway of a
    shared fleet reads them. The gateway refuses to start, naming the settings."""
    settings = Settings(data_dir=tmp_path, database_url=database_uri, pool_backend="kubernetes",
                        worker_image="kiln/w:1", kubernetes_store_claim="kiln-store",
                        worker_secret=SecretStr(SECRET), shared_workers=True)  # fmt: skip
    refused = (
        r"KILN_KUBERNETES_STORE_CLAIM=kiln-store is not mounted at KILN_DATA_DIR/store "
        r".*KILN_SHARED_WORKERS=true.*KILN_ARTIFACT_STORE=s3://"
    )
    with pytest.raises(ValueError, match=refused):
        async with running(settings, BatchRunner(settings)):
            pass
    RequestMetrics(False).close()  # the refusal left no series registered process-wide
    check_store(settings, ismount=lambda path: path == str(tmp_path / "store"))  # mounted
    check_store(settings.model_copy(update={"artifact_store": "s3://bucket/kiln"}))


@pytest.mark.skipif(
    not (os.environ.get("KUBECONFIG") and os.environ.get("KILN_TEST_KUBE_NAMESPACE")),
    reason="needs a real cluster: set KUBECONFIG and KILN_TEST_KUBE_NAMESPACE (a scratch "
    "namespace the kubeconfig's user may create Deployments in)",
)
async def test_against_a_real_cluster(tmp_path: Path) -> None:
    """The API server accepts the rendered Deployment (admission, the selector matching the
    template), the replica patch and the delete; no pod has to start."""
    namespace = os.environ["KILN_TEST_KUBE_NAMESPACE"]
    settings = Settings(data_dir=tmp_path, pool_backend="kubernetes", worker_image="busybox",
                        kubernetes_store_claim="kiln-store", worker_secret=SecretStr(SECRET),
                        kubernetes_namespace=namespace)  # fmt: skip
    spec = PoolSpec("kiln-backend-test", str(int(time.time())), tmp_path)
    async with aiohttp.ClientSession() as http:
        pools = KubernetesPoolBackend(settings, http, poll_s=0.2)
        seen: list[PoolWorker] = []
        pools.on_change = seen.append
        try:
            pools.ensure(spec)
            pools.scale(spec.key, 0)
            await pools.sync()
            pools.scale(spec.key, 1)
            await pools.sync()
            assert len(pools.pools[spec.key]) == 1
        finally:
            pools.remove(spec.key)
            await pools.sync()
            await pools.stop()
