"""Rollouts through ``/admin/v1/models/{name}/rollout``: validation naming the field,
platform-admins only, audited; the rollout owns the route while it runs; a restarted gateway
resumes it from PostgreSQL; aborting sends everyone back to stable. (The analysis against real
workers is ``tests/e2e/test_rollouts.py``.)"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, cast

import pytest
from pydantic import SecretStr

from kiln_platform.registry.outcomes import RolloutOutcomes
from kiln_platform.registry.resolver import Resolver
from kiln_platform.registry.rollout_monitor import RolloutMonitor
from kiln_platform.registry.routes import Route
from kiln_platform.registry.services import register_version
from kiln_platform.settings import Settings
from kiln_runtimes.protocol import ModelManifest

from .conftest import Admin

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

MODEL = "rolled-emb"
PATH = f"/admin/v1/models/{MODEL}/rollout"


@pytest.fixture(scope="module")
def settings(database_uri: str, tmp_path_factory: pytest.TempPathFactory) -> Settings:
    """No worker starts (the registered versions have no real files)."""
    return Settings(
        data_dir=tmp_path_factory.mktemp("data"), database_url=database_uri,
        secret_key=SecretStr("rollouts-test-secret"), key_cache_ttl_s=0.0,
        pool_initial_replicas=0,
    )  # fmt: skip


@pytest.fixture(scope="module")
async def versions(admin: Admin, root: str) -> None:
    """Versions 1 and 2, routed to 1."""
    manifest = ModelManifest(name=MODEL, task="embeddings", engine="onnxruntime", dimensions=4)
    for v in ("1", "2"):
        async with admin.kiln.db.sessions.begin() as session:
            await register_version(session, manifest, v, f"sha256:{v * 64}")
    r = await admin.call("PUT", f"/admin/v1/models/{MODEL}/route", root,
                         json={"stable_version": "1"})  # fmt: skip
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"canary_version": "9"}, "canary_version"),
        ({"canary_version": "1"}, "canary_version"),  # the stable one
        ({"canary_version": "2", "plan": {"steps": [50, 20, 100]}}, "plan.steps"),
        ({"canary_version": "2", "plan": {"steps": [20, 50]}}, "plan.steps"),
        ({"canary_version": "2", "plan": {"progress_deadline_s": 0}}, "plan.progress_deadline_s"),
    ],
)
async def test_a_bad_rollout_names_its_field(
    admin: Admin, root: str, versions: None, body: dict[str, object], field: str
) -> None:
    r = await admin.call("PUT", PATH, root, json=body)
    assert r.status_code == 400, r.text
    assert r.json()["param"] == field


async def test_only_platform_admins_roll_out(admin: Admin, root: str, versions: None) -> None:
    tenant = await admin.tenant(root, "rollout-tenant")
    key = await admin.key(root, tenant, role="tenant-admin", scopes=["admin:write"])
    for method in ("GET", "PUT", "DELETE"):
        r = await admin.call(method, PATH, key, json={"canary_version": "2"})
        assert r.status_code == 403, (method, r.text)
    assert (await admin.call("GET", PATH, root)).status_code == 404  # none yet


async def test_a_rollout_owns_the_route_survives_a_restart_and_aborts(
    admin: Admin, root: str, versions: None
) -> None:
    plan = {"steps": [10, 50, 100], "split": "request", "min_seconds": 3600}
    r = await admin.call("PUT", PATH, root, json={"canary_version": "2", "plan": plan})
    assert r.status_code == 200, r.text
    started = r.json()
    assert (started["state"], started["percent"], started["stable_version"]) == ("running", 10, "1")
    assert started["failure_bound"] == 6 + 11 - 1  # 10 %: 6 failures, 50 %: 11
    assert admin.kiln.resolver.routes[MODEL] == Route("1", "2", 10, by_request=True)
    r = await admin.call("PUT", f"/admin/v1/models/{MODEL}/route", root,
                         json={"stable_version": "2"})  # fmt: skip
    assert r.status_code == 409  # the rollout owns the route
    r = await admin.call("PUT", PATH, root, json={"canary_version": "2"})
    assert r.status_code == 409  # one at a time

    # a fresh gateway's resolver and monitor resume it from the database alone
    resolver, outcomes = Resolver(admin.kiln.db.sessions), RolloutOutcomes()
    monitor = RolloutMonitor(admin.kiln.db.sessions, outcomes, 1.0, resolver.refresh, _nothing)
    await monitor.reload()
    assert resolver.routes[MODEL] == Route("1", "2", 10, by_request=True)
    outcomes.observe(MODEL, "2", 500, 0.01, degenerate=False)
    assert [(step, arm, a.errors) for (_, step, arm), a in outcomes.snapshot().items()] == [
        (0, "canary", 1)
    ]

    r = await admin.call("DELETE", PATH, root)
    assert r.status_code == 200, r.text
    assert (r.json()["state"], r.json()["percent"]) == ("aborted", 0)
    assert admin.kiln.resolver.routes[MODEL] == Route("1")
    assert (await admin.call("DELETE", PATH, root)).status_code == 409
    history = (await admin.call("GET", PATH, root)).json()["history"]
    assert [h["action"] for h in history] == ["start", "abort"]
    r = await admin.call("GET", "/admin/v1/audit", root, params={"action": "model.rollout"})
    assert [a["after"].get("state", "running") for a in r.json()["data"]] == ["aborted", "running"]


async def test_a_canary_never_ready_rolls_back_at_its_progress_deadline(
    admin: Admin, root: str, versions: None
) -> None:
    """Draws kept on stable while the canary's pool starts, counted by one gateway, roll the
    rollout back once its step passes the deadline with none served by the canary."""
    plan = {"steps": [10, 100], "split": "request", "min_seconds": 3600,
            "progress_deadline_s": 0.5}  # fmt: skip
    r = await admin.call("PUT", PATH, root, json={"canary_version": "2", "plan": plan})
    assert r.status_code == 200, r.text
    outcomes = RolloutOutcomes()
    monitor = RolloutMonitor(admin.kiln.db.sessions, outcomes, 1.0, _nothing, _nothing)
    await monitor.reload()
    for _ in range(3):
        outcomes.deferred(MODEL)  # as Resolver.resolve does while the canary warms
    await asyncio.sleep(0.5)  # holding before the deadline: tests/unit/registry
    for _ in range(50):  # this monitor decides, or the app's own (the lock's holder) once it
        await monitor.tick()  # has read these counts
        got = (await admin.call("GET", PATH, root)).json()
        if got["state"] != "running":
            break
        await asyncio.sleep(0.1)
    assert got["state"] == "rolled_back", got
    last = got["history"][-1]
    assert "progress_deadline_s" in last["reason"]
    assert (last["figures"]["deferred"], last["figures"]["canary"]["requests"]) == (3, 0)
    await admin.kiln.pools.reconcile()
    assert admin.kiln.resolver.routes[MODEL] == Route("1")


class _CountedSessions:
    """The real session factory, counting the transactions begun through it."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self._sessions, self.begun = sessions, 0

    def __call__(self) -> AsyncSession:
        return self._sessions()

    def begin(self) -> Any:
        self.begun += 1
        return self._sessions.begin()


async def test_an_idle_monitor_takes_no_lock(admin: Admin) -> None:
    sessions = _CountedSessions(admin.kiln.db.sessions)
    monitor = RolloutMonitor(cast("Any", sessions), RolloutOutcomes(), 1.0, _nothing, _nothing)
    await monitor.reload()  # no rollout runs (the one above was aborted)
    await monitor.tick()
    await monitor.tick()
    assert sessions.begun == 0  # no advisory-lock transaction, no second select


async def _nothing() -> None:
    """No alert delivery here."""
