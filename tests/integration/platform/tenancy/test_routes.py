"""Model routes through ``/admin/v1/models/{name}/route``: validation that names the field,
platform-admins only, audited; and the resolver and pools that follow a route (canary share,
sticky per tenant, pinned versions, rollback retiring the canary's pool)."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest
from pydantic import SecretStr
from sqlalchemy import select, update

from kiln_platform.admin.authz import Actor, Role
from kiln_platform.db.tables import Model, ModelVersion
from kiln_platform.errors import ModelNotFound
from kiln_platform.registry.resolver import MISS_REFRESH_S, Resolver
from kiln_platform.registry.services import list_routes, register_version
from kiln_platform.settings import Settings
from kiln_runtimes.protocol import ModelManifest

from .conftest import Admin

MODEL = "routed-emb"
TENANTS = [str(uuid.UUID(int=i)) for i in range(1000)]


@pytest.fixture(scope="module")
def settings(database_uri: str, tmp_path_factory: pytest.TempPathFactory) -> Settings:
    """No worker starts until a request asks (the registered versions have no real files)."""
    return Settings(
        data_dir=tmp_path_factory.mktemp("data"), database_url=database_uri,
        secret_key=SecretStr("routes-test-secret"), key_cache_ttl_s=0.0, pool_initial_replicas=0,
    )  # fmt: skip


@pytest.fixture(scope="module")
async def versions(admin: Admin) -> list[str]:
    manifest = ModelManifest(name=MODEL, task="embeddings", engine="onnxruntime", dimensions=4)
    for v in ("1", "2", "3"):  # one transaction each: now() orders them
        async with admin.kiln.db.sessions.begin() as session:
            await register_version(session, manifest, v, f"sha256:{v * 64}")
    return ["1", "2", "3"]


async def test_without_a_route_the_newest_serves(
    admin: Admin, root: str, versions: list[str]
) -> None:
    r = await admin.call("GET", f"/admin/v1/models/{MODEL}/route", root)
    assert r.json() == {"model": MODEL, "stable_version": "3", "canary_version": None,
                        "canary_percent": 0, "routed": False}  # fmt: skip
    await admin.kiln.pools.reconcile()
    assert (await admin.kiln.resolver.resolve(MODEL, TENANTS[0])).version == "3"


async def test_a_newest_staging_version_is_not_reported_as_serving(admin: Admin, root: str) -> None:
    name = "staged-emb"
    manifest = ModelManifest(name=name, task="embeddings", engine="onnxruntime", dimensions=4)
    for v in ("1", "2"):  # one transaction each: now() orders them
        async with admin.kiln.db.sessions.begin() as session:
            await register_version(session, manifest, v, f"sha256:{v * 64}")
    async with admin.kiln.db.sessions.begin() as session:
        model_id = select(Model.id).where(Model.name == name).scalar_subquery()
        await session.execute(update(ModelVersion).values(state="staging").where(
            ModelVersion.model_id == model_id, ModelVersion.version == "2"))  # fmt: skip
    r = await admin.call("GET", f"/admin/v1/models/{name}/route", root)
    assert (r.json()["stable_version"], r.json()["routed"]) == ("1", False)
    async with admin.kiln.db.sessions() as session:
        routes = await list_routes(session, Actor("test", Role.PLATFORM_ADMIN, None))
    assert {view.model: view.stable_version for view, _ in routes}[name] == "1"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"stable_version": "9"}, "stable_version"),
        (
            {"stable_version": "1", "canary_version": "9", "canary_percent": 5},
            "canary_version",
        ),
        (
            {"stable_version": "1", "canary_version": "1", "canary_percent": 5},
            "canary_version",
        ),
        ({"stable_version": "1", "canary_percent": 5}, "canary_percent"),
        (
            {"stable_version": "1", "canary_version": "2", "canary_percent": 101},
            "canary_percent",
        ),
        ({"stable_version": "1", "weight": 3}, "weight"),
    ],
)
async def test_bad_routes_name_the_field(
    admin: Admin, root: str, versions: list[str], body: dict[str, object], field: str
) -> None:
    r = await admin.call("PUT", f"/admin/v1/models/{MODEL}/route", root, json=body)
    assert r.status_code == 400, r.text
    assert r.json()["param"] == field
    r = await admin.call(
        "PUT", "/admin/v1/models/no-such/route", root, json={"stable_version": "1"}
    )
    assert r.status_code == 404


async def test_only_platform_admins_route(admin: Admin, root: str, versions: list[str]) -> None:
    tenant = await admin.tenant(root, f"t-{uuid.uuid4()}")
    tenant_admin = await admin.key(root, tenant, scopes=["admin:write"])
    finance = await admin.key(root, tenant, scopes=["admin:read"], role="finance")
    path, body = f"/admin/v1/models/{MODEL}/route", {"stable_version": "1"}
    assert (await admin.call("PUT", path, tenant_admin, json=body)).status_code == 403
    assert (await admin.call("GET", path, tenant_admin)).status_code == 200
    assert (await admin.call("GET", path, finance)).status_code == 403


async def test_a_canary_takes_its_share_sticky_and_rollback_retires_it(
    admin: Admin, root: str, versions: list[str]
) -> None:
    path = f"/admin/v1/models/{MODEL}/route"
    body = {"stable_version": "1", "canary_version": "2", "canary_percent": 30}
    r = await admin.call("PUT", path, root, json=body)
    assert r.status_code == 200, r.text
    assert (await admin.call("GET", path, root)).json() == {**body, "model": MODEL, "routed": True}
    resolver, pools = admin.kiln.resolver, admin.kiln.pools
    await resolver.refresh()
    drawn = [getattr(resolver._lookup(MODEL, None, t), "version", None) for t in TENANTS]
    assert set(drawn) == {"1", "2"}
    assert abs(drawn.count("2") / len(TENANTS) - 0.30) < 0.05
    assert [getattr(resolver._lookup(MODEL, None, t), "version", None) for t in TENANTS] == drawn
    # no worker of version 2 is ready (its files are made up): its draws are served by stable,
    # are no rollout's evidence, and start the canary's pool
    canary = TENANTS[drawn.index("2")]
    assert not pools.is_ready(f"{MODEL}@2")
    assert (await resolver.resolve(MODEL, canary)).version == "1"
    assert not resolver.split(MODEL, canary)
    assert pools.desired[f"{MODEL}@2"] >= 1
    assert {k for k in pools.desired if k.startswith(MODEL)} == {f"{MODEL}@1", f"{MODEL}@2"}
    assert (await resolver.resolve(f"{MODEL}@2")).version == "2"
    with pytest.raises(ModelNotFound):
        await resolver.resolve(f"{MODEL}@9")  # never registered

    r = await admin.call("PUT", path, root, json={"stable_version": "1"})  # roll back
    assert r.status_code == 200
    assert {(await resolver.resolve(MODEL, t)).version for t in TENANTS} == {"1"}
    assert {k for k in pools.desired if k.startswith(MODEL)} == {f"{MODEL}@1"}
    assert (await resolver.resolve(f"{MODEL}@3")).version == "3"  # by number: served on demand
    assert f"{MODEL}@3" in {v.pool for v in await resolver.refresh()}


async def test_unknown_names_share_one_catalog_reload_per_quarter_second(admin: Admin) -> None:
    reloads = 0

    def counted() -> Any:
        nonlocal reloads
        reloads += 1
        return admin.kiln.db.sessions()

    resolver = Resolver(counted)  # type: ignore[arg-type]
    started = time.monotonic()
    for wave in (1, 2):
        made_up = (resolver.resolve(f"made-up-{wave}-{i}") for i in range(200))
        results = await asyncio.gather(*made_up, return_exceptions=True)
        assert all(isinstance(r, ModelNotFound) for r in results)
        assert reloads == wave  # 200 misses, one reload
    assert time.monotonic() - started >= MISS_REFRESH_S  # the second wave waited its turn
    manifest = ModelManifest(name="fresh", task="embeddings", engine="onnxruntime", dimensions=4)
    async with admin.kiln.db.sessions.begin() as session:
        await register_version(session, manifest, "1", f"sha256:{'f' * 64}")
    assert (await resolver.resolve("fresh")).version == "1"  # new since the last reload: found


async def test_oip_readiness_follows_the_tenants_pin_and_names_the_version(
    admin: Admin, root: str
) -> None:
    name = "pinned-tensor"
    manifest = ModelManifest(name=name, task="tensor", engine="onnxruntime")
    for v in ("1", "2"):  # one transaction each: now() orders them
        async with admin.kiln.db.sessions.begin() as session:
            await register_version(session, manifest, v, f"sha256:{v * 64}")
    tenant = await admin.tenant(root, "oip-pinned-tenant")
    key = await admin.key(root, tenant)
    r = await admin.call("PUT", f"/admin/v1/models/{name}/pins/{tenant}", root,
                         json={"target": "1"})  # fmt: skip
    assert r.status_code == 200, r.text
    await admin.kiln.resolver.refresh()
    r = await admin.call("GET", f"/v2/models/{name}/ready", key)
    assert r.status_code in {200, 503}, r.text
    assert r.headers["x-kiln-model-version"] == "1"  # the pin's, not the newest
    r = await admin.call("GET", f"/v2/models/{name}/versions/2/ready", key)
    assert r.headers["x-kiln-model-version"] == "2"
