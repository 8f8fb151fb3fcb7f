"""The shed gate on the real app and PostgreSQL: while a pool's refusal is held, the requests
that follow for the same tenant, model and class (with no longer a deadline) get it repeated,
429 + Retry-After in the OpenAI shape, before the route runs; every other request reaches the
route (here it answers 400: the registered model is a tensor model, no worker needed)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest
from pydantic import SecretStr

from kiln_console.compose import create_app
from kiln_platform.admission.services import QueueTerms
from kiln_platform.context import Kiln
from kiln_platform.errors import Overloaded
from kiln_platform.registry.services import register_version
from kiln_platform.scheduler.schemas import Priority
from kiln_platform.settings import Settings
from kiln_runtimes.protocol import ModelManifest
from tests.asgi import asgi
from tests.factories import make_root_key

from ..conftest import serving

MODEL = "gated"


@dataclass
class Gate:
    kiln: Kiln
    http: httpx.AsyncClient
    tenant: str

    async def embed(self, model: str = MODEL, **headers: str) -> httpx.Response:
        named = {k.replace("_", "-"): v for k, v in headers.items()}
        return await self.http.post(
            "/v1/embeddings", json={"model": model, "input": "x"}, headers=named
        )

    def refuse(self, retry_after: float, timeout_s: float = 2.0) -> None:
        """Hold a refusal as the pool's screen would after turning a request away."""
        error = Overloaded("Too much at once. Retry after the indicated time.",
                           retry_after=retry_after)  # fmt: skip
        key = (self.tenant, MODEL, Priority.INTERACTIVE)
        self.kiln.admissions.refusals.hold(key, timeout_s, error)


@pytest.fixture(scope="module")
async def gate(database_uri: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Gate]:
    settings = Settings(
        data_dir=tmp_path_factory.mktemp("data"), database_url=database_uri,
        secret_key=SecretStr("shed-gate-secret"), key_cache_ttl_s=60.0, pool_initial_replicas=0,
    )  # fmt: skip
    app = create_app(settings)
    async with serving(app):
        kiln: Kiln = app.state.kiln
        manifest = ModelManifest(name=MODEL, task="tensor", engine="onnxruntime")
        async with kiln.db.sessions.begin() as session:
            made = await make_root_key(session, settings.hmac_key(), tenant=f"g-{uuid.uuid4()}")
            await register_version(session, manifest, "1", f"sha256:{'a' * 64}")
        await kiln.resolver.refresh()
        transport = httpx.ASGITransport(app=asgi(app))
        headers = {"authorization": f"Bearer {made.secret}"}
        async with httpx.AsyncClient(transport=transport, base_url="http://kiln.test",
                                     headers=headers) as http:  # fmt: skip
            gate = Gate(kiln, http, str(made.key.tenant_id))
            assert (await gate.embed(x_kiln_timeout="2")).status_code == 400  # key now cached
            yield gate


async def test_a_held_refusal_is_repeated_before_the_route_runs(gate: Gate) -> None:
    gate.refuse(retry_after=0.4)
    refused = await gate.embed(x_kiln_timeout="2")
    assert refused.status_code == 429
    assert refused.headers["retry-after"] == "1"
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert "Too much at once" in refused.json()["error"]["message"]
    # once its time is up the route decides again
    await asyncio.sleep(0.45)
    assert (await gate.embed(x_kiln_timeout="2")).status_code == 400
    assert not gate.kiln.admissions.refusals


async def test_other_requests_pass_the_gate(gate: Gate) -> None:
    gate.refuse(retry_after=30.0)  # held for at most MAX_HELD_S (1 s)
    assert (await gate.embed(x_kiln_timeout="5")).status_code == 400  # a longer deadline
    assert (await gate.embed(x_kiln_timeout="2", x_kiln_priority="batch")).status_code == 400
    assert (await gate.embed("other", x_kiln_timeout="2")).status_code == 404  # another model
    unknown = await gate.embed(x_kiln_timeout="2", authorization="Bearer kiln_00000000_nope")
    assert unknown.status_code == 401  # not a cached key: the route answers it
    await asyncio.sleep(1.05)


async def test_no_refusal_held_costs_nothing(gate: Gate) -> None:
    assert not gate.kiln.admissions.refusals
    assert (await gate.embed(x_kiln_timeout="2")).status_code == 400


async def test_a_screen_refusal_with_a_retry_time_is_held(gate: Gate) -> None:
    admission = gate.kiln.admissions.open({})
    admission.terms = QueueTerms(tenant=gate.tenant, timeout_s=2.0)
    with pytest.raises(Overloaded), admission.screening(MODEL):
        raise Overloaded("Over share.", retry_after=0.3)
    assert gate.kiln.admissions.refusals.refusal(gate.tenant, MODEL, Priority.INTERACTIVE, 2.0)
    assert (await gate.embed(x_kiln_timeout="2")).status_code == 429
    await asyncio.sleep(0.35)
