"""The console's models page: versions, routes and pools; routing through its form."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import msgspec
import pytest
from pydantic import SecretStr
from sqlalchemy import func, select, update

from kiln_platform.admin.authz import Actor, Role
from kiln_platform.registry import aliases, rollouts, versions
from kiln_platform.registry.rollout_monitor import apply
from kiln_platform.registry.rollout_policy import Action, Arm, decide
from kiln_platform.registry.schemas import RolloutPlan, RolloutStart
from kiln_platform.registry.services import register_version
from kiln_platform.registry.tables import ModelRollout
from kiln_platform.settings import Settings
from kiln_platform.shadow import services as shadows
from kiln_platform.shadow.schemas import ShadowReport, ShadowUpdate
from kiln_platform.shadow.tables import ShadowReport as ShadowReportRow
from kiln_runtimes.protocol import ModelManifest

from .conftest import App

HX = {"hx-request": "true"}


@pytest.fixture(scope="module")
def settings(database_uri: str, tmp_path_factory: pytest.TempPathFactory) -> Settings:
    """No worker starts until a request asks (the registered versions have no real files)."""
    return Settings(
        data_dir=tmp_path_factory.mktemp("data"), database_url=database_uri,
        secret_key=SecretStr("console-test-secret"), pool_initial_replicas=0,
    )  # fmt: skip


@pytest.fixture(scope="module")
async def model(app: App) -> str:
    name = f"m-{uuid.uuid4().hex[:6]}"
    manifest = ModelManifest(name=name, task="embeddings", engine="onnxruntime", dimensions=4)
    for v in ("1", "2"):
        async with app.kiln.db.sessions.begin() as session:
            await register_version(session, manifest, v, f"sha256:{v * 64}")
    return name


async def test_a_platform_admin_routes_a_canary_from_the_page(app: App, model: str) -> None:
    async with app.signed_in(await app.user("platform-admin")) as (http, token):
        page = await http.get("/console/models")
        assert page.status_code == 200
        assert f'id="model-{model}"' in page.text
        headers = {**HX, "x-csrftoken": token}
        form = {"stable_version": "1", "canary_version": "2", "canary_percent": "30"}
        r = await http.post(f"/console/models/{model}/route", data=form, headers=headers)
        assert r.status_code == 200, r.text
        assert "canary (30 %)" in r.text
        assert "stable (70 %)" in r.text
        assert app.kiln.resolver.routes[model].canary_percent == 30
        bad = {"stable_version": "1", "canary_version": "2", "canary_percent": "lots"}
        r = await http.post(f"/console/models/{model}/route", data=bad, headers=headers)
        assert r.status_code == 400
        assert 'data-field="canary_percent"' in r.text
        same = {"stable_version": "2", "canary_version": "2", "canary_percent": "5"}
        r = await http.post(f"/console/models/{model}/route", data=same, headers=headers)
        assert r.status_code == 400
        assert 'data-field="canary_version"' in r.text
        assert app.kiln.resolver.routes[model].canary_percent == 30  # unchanged


async def test_the_page_shows_states_and_aliases(app: App, model: str) -> None:
    cli = Actor("cli:test", Role.PLATFORM_ADMIN, None)
    async with app.kiln.db.sessions.begin() as session:
        await aliases.set_alias(session, cli, model, "prod", "1")
        change = versions.VersionUpdate(state="deprecated", successor="2")
        await versions.update_version(session, cli, model, "1", change)
    tenant = await app.tenant()
    async with app.signed_in(await app.user("tenant-admin", tenant)) as (http, _):
        page = await http.get("/console/models")
    card = page.text.split(f'id="model-{model}"')[1]
    fold = card.split('<details class="version" data-version="1"')[1].split("</details>")[0]
    assert '<span class="lifecycle">deprecated</span> → 2' in fold
    assert '<span class="aliases">prod</span>' in fold


async def test_other_roles_read_or_are_refused(app: App, model: str) -> None:
    tenant = await app.tenant()
    async with app.signed_in(await app.user("tenant-admin", tenant)) as (http, token):
        page = await http.get("/console/models")
        assert page.status_code == 200
        assert 'class="route"' not in page.text  # no form
        r = await http.post(f"/console/models/{model}/route", data={"stable_version": "1"},
                            headers={**HX, "x-csrftoken": token})  # fmt: skip
        assert r.status_code == 403
    async with app.signed_in(await app.user("finance")) as (http, _):
        assert (await http.get("/console/models")).status_code == 403


async def test_a_platform_admin_sets_pool_bounds_and_reads_the_live_table(
    app: App, model: str
) -> None:
    async with app.signed_in(await app.user("platform-admin")) as (http, token):
        headers = {**HX, "x-csrftoken": token}
        url = f"/console/models/{model}/versions/2/engine"
        for form, field in (({"min_replicas": "3", "max_replicas": "2"}, "min_replicas"),
                            ({"max_replicas": "0"}, "max_replicas"),
                            ({"max_batch_size": "many"}, "max_batch_size")):  # fmt: skip
            r = await http.post(url, data=form, headers=headers)
            assert r.status_code == 400, form
            assert f'data-field="{field}"' in r.text
        r = await http.post(url, data={"min_replicas": "0", "max_replicas": "2"}, headers=headers)
        assert r.status_code == 200, r.text
        assert (
            'name="max_replicas" size="5" inputmode="numeric" placeholder="default" value="2"'
            in r.text
        )
        async with app.kiln.db.sessions.begin() as session:
            _, row = await versions.find_version(session, model, "2")
        assert row.engine_settings == {"min_replicas": 0, "max_replicas": 2}
        live = await http.get(f"/console/models/{model}/pools", headers=HX)
        assert live.status_code == 200
        assert 'data-version="2" data-state="' in live.text
        assert (await http.get("/console/models/nope/pools")).status_code == 404


async def test_platform_admins_see_the_shadow_comparison(app: App, model: str) -> None:
    cli = Actor("cli:test", Role.PLATFORM_ADMIN, None)
    report = ShadowReport(model=model, candidate="2", gateway="gw-a", mirrored=40,
                          dropped={"busy": 3}, compared=40, agreement=0.975,
                          cosine_mean=0.99991, cosine_min=0.98, primary_p99_ms=21.0)  # fmt: skip
    async with app.kiln.db.sessions.begin() as session:
        await shadows.set_shadow(session, cli, model, ShadowUpdate(version="2", percent=20))
        await shadows.persist(session, [report])
        await shadows.persist(session, [msgspec.structs.replace(report, mirrored=41)])  # upsert
    async with app.kiln.db.sessions() as session:
        view = await shadows.view(session, cli, model)
    assert (view.version, view.percent, [r.mirrored for r in view.reports]) == ("2", 20, [41])
    async with app.signed_in(await app.user("platform-admin")) as (http, _):
        page = (await http.get("/console/models")).text
    assert f'<table class="shadow" data-model="{model}">' in page
    assert "20 % of requests copied to version" in page
    assert '<td class="agreement">97.5 %</td>' in page
    assert '<td class="mirrored">41</td>' in page
    assert '<td class="updated">20' in page  # when gw-a last wrote it
    tenant = await app.tenant()
    async with app.signed_in(await app.user("tenant-admin", tenant)) as (http, _):
        page = (await http.get("/console/models")).text
    assert 'class="shadow"' not in page  # a report spans every tenant's requests


async def test_a_gone_gateways_report_is_not_listed_and_is_deleted(app: App, model: str) -> None:
    cli = Actor("cli:test", Role.PLATFORM_ADMIN, None)
    gone = ShadowReport(model=model, candidate="2", gateway="gw-gone:1", mirrored=7)
    async with app.kiln.db.sessions.begin() as session:
        await shadows.persist(session, [gone, msgspec.structs.replace(gone, gateway="gw-up:2")])
        await session.execute(
            update(ShadowReportRow).where(ShadowReportRow.gateway == "gw-gone:1")
            .values(updated_at=func.now() - timedelta(hours=2))
        )  # fmt: skip
    async with app.kiln.db.sessions() as session:
        view = await shadows.view(session, cli, model)
        listed = await shadows.views(session, cli)
    assert "gw-gone:1" not in {r.gateway for r in view.reports}
    assert "gw-gone:1" not in {r.gateway for r in listed[model].reports}
    (up,) = [r for r in view.reports if r.gateway == "gw-up:2"]
    live = [msgspec.structs.replace(gone, gateway="gw-up:2", mirrored=99)]
    async with app.kiln.db.sessions() as session:  # this gateway's live report replaces its row
        merged = await shadows.views(session, cli, live)
    assert [r.mirrored for r in merged[model].reports if r.gateway == "gw-up:2"] == [99]
    assert up.updated_at is not None
    assert up.updated_at > datetime.now(UTC) - timedelta(minutes=5)
    async with app.kiln.db.sessions.begin() as session:
        await shadows.persist(session, [msgspec.structs.replace(gone, gateway="gw-up:2")])
        left = await session.scalars(
            select(ShadowReportRow.gateway).where(ShadowReportRow.gateway.like("gw-%:_"))
        )
        assert set(left) == {"gw-up:2"}


async def test_a_rollouts_step_and_decisions_on_the_models_fold(app: App) -> None:
    name = f"r-{uuid.uuid4().hex[:6]}"
    manifest = ModelManifest(name=name, task="embeddings", engine="onnxruntime", dimensions=4)
    cli, plan = Actor("cli:test", Role.PLATFORM_ADMIN, None), RolloutPlan(steps=[10, 50, 100])
    for v in ("1", "2"):
        async with app.kiln.db.sessions.begin() as session:
            await register_version(session, manifest, v, f"sha256:{v * 64}")
    async with app.kiln.db.sessions.begin() as session:
        started = await rollouts.start_rollout(
            session, cli, name, RolloutStart(canary_version="2", plan=plan)
        )
    async with app.kiln.db.sessions.begin() as session:  # the monitor's promotion, applied
        rollout = await session.get_one(ModelRollout, started.id)
        canary, stable = Arm(250, latency=[250] + [0] * 127), Arm(2250, latency=[2250] + [0] * 127)
        decision = decide(plan, 0, canary, stable, elapsed_s=61)
        assert decision.action is Action.PROMOTE
        await apply(session, rollout, name, plan, decision, datetime.now(UTC))
    async with app.signed_in(await app.user("platform-admin")) as (http, _):
        page = await http.get("/console/models")
    card = page.text.split(f'id="model-{name}"')[1]
    fold = card.split('<details class="rollout" data-state="running" open>')[1].split("</details>")[
        0
    ]
    assert '<span class="rollout-step">50 %</span> of 10 → 50 → 100 %' in fold
    promoted = fold.split('<tr data-action="promote">')[1].split("</tr>")[0]
    assert "<td>10 %</td>" in promoted
    assert "250 / 0" in promoted
    assert "2250 / 0" in promoted
    assert 'data-action="start"' in fold
    tenant = await app.tenant()
    async with app.signed_in(await app.user("tenant-admin", tenant)) as (http, _):
        page = await http.get("/console/models")
    assert f'id="model-{name}"' in page.text
    assert 'class="rollout"' not in page.text  # platform-admins alone see rollouts
