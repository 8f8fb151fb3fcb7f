"""Tenants' outbound webhooks, end to end in-process: endpoints registered through
``/admin/v1/tenants/{id}/webhooks`` (the SSRF guard refusing private targets), events written
to the outbox in the transaction that makes them (a batch failing, a rolled-back one not), the
delivery loop POSTing them to real receivers on loopback, each verified with the
``standardwebhooks`` library; retries with backoff, the delivery log, redelivery, rotation.
The real app, a real PostgreSQL, the official ``openai`` SDK for the batch."""

from __future__ import annotations

import asyncio
import io
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx
import httpx2
import msgspec
import openai
import pytest
from aiohttp import web
from cryptography.exceptions import InvalidTag
from pydantic import SecretStr
from standardwebhooks import Webhook, WebhookVerificationError

from kiln_platform.app import create_app
from kiln_platform.billing.budgets import Settled, settle
from kiln_platform.cli._base import cli_actor
from kiln_platform.db.tables import Quota
from kiln_platform.keys.services import insert_key
from kiln_platform.settings import Settings
from kiln_platform.tenants.services import insert_tenant
from kiln_platform.webhooks import events, guard, services, signing
from kiln_platform.webhooks.schemas import EndpointCreate
from kiln_platform.webhooks.sender import WebhookSender
from kiln_platform.webhooks.tables import WebhookEndpoint
from tests.asgi import asgi

from ..conftest import serving

BASE_S = 0.3


@dataclass
class Receiver:
    """Keeps what its secret verifies (by ``webhook-id``, with the arrival time); answers
    ``fail_first`` requests with 500 first."""

    secret: str = ""
    fail_first: int = 0
    seen: list[tuple[str, float, dict[str, Any]]] = field(default_factory=list)
    unverified: int = 0
    raw: list[tuple[bytes, dict[str, str]]] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.raw.append((body, dict(request.headers)))
        try:
            payload = Webhook(self.secret).verify(body, dict(request.headers))
        except WebhookVerificationError:
            self.unverified += 1
            return web.Response(status=401)
        self.seen.append((request.headers["webhook-id"], time.monotonic(), payload))
        return web.Response(status=500 if len(self.seen) <= self.fail_first else 204)


@asynccontextmanager
async def loopback(receiver: Receiver, host: str = "127.0.0.1") -> AsyncIterator[str]:
    """Serve ``receiver`` at ``POST /hook`` on a free port of ``host``; yields its URL."""
    app = web.Application()
    app.router.add_post("/hook", receiver.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, host, 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://{host}:{port}/hook"
    finally:
        await runner.cleanup()


@dataclass
class World:
    app: Any
    admin: httpx.AsyncClient
    tenant: uuid.UUID
    inference_key: str

    @property
    def base(self) -> str:
        return f"/admin/v1/tenants/{self.tenant}/webhooks"

    async def register(self, url: str, *kinds: str) -> tuple[str, str]:
        r = await self.admin.post(self.base, json={"url": url, "events": list(kinds)})
        assert r.status_code == 201, r.text
        return r.json()["endpoint"]["id"], r.json()["secret"]


@pytest.fixture(scope="module")
async def world(
    database_uri: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[World]:
    settings = Settings(
        data_dir=tmp_path_factory.mktemp("data"), database_url=database_uri,
        secret_key=SecretStr("webhooks"), log_level="error", pool_initial_replicas=0,
        webhook_allow_networks="127.0.0.1/32", webhook_retry_base_s=BASE_S,
        webhook_poll_s=0.05, batch_poll_s=0.05,
    )  # fmt: skip
    app = create_app(settings)
    async with serving(app):
        async with app.state.kiln.db.sessions.begin() as session:
            tenant = await insert_tenant(session, f"hooks-{uuid.uuid4().hex[:6]}")
            scopes = frozenset({"admin:read", "admin:write"})
            _, admin = await insert_key(session, settings.hmac_key(), tenant.id,
                                        role="tenant-admin", scopes=scopes)  # fmt: skip
            _, inference = await insert_key(session, settings.hmac_key(), tenant.id)
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=asgi(app)), base_url="http://kiln.test",
            headers={"authorization": f"Bearer {admin}"},
        ) as client:  # fmt: skip
            yield World(app, client, tenant.id, inference)


async def _until(check: Callable[[], bool | Awaitable[bool]], limit_s: float = 10.0) -> None:
    deadline = time.monotonic() + limit_s
    while True:
        done = check()
        if not isinstance(done, bool):
            done = await done
        if done:
            return
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def _fail_a_batch(world: World) -> str:
    """A batch (the official SDK) whose only line names no model: validation fails it."""
    http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=asgi(world.app)))  # openai's
    client = openai.AsyncOpenAI(base_url="http://kiln.test/v1", api_key=world.inference_key,
                                http_client=http, max_retries=0)  # fmt: skip
    line = {"custom_id": "a", "method": "POST", "url": "/v1/embeddings",
            "body": {"model": "no-such", "input": "x"}}  # fmt: skip
    async with client:
        uploaded = await client.files.create(
            file=("in.jsonl", io.BytesIO(msgspec.json.encode(line) + b"\n")), purpose="batch"
        )
        batch = await client.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h"
        )
    return batch.id


async def test_each_event_is_delivered_once_and_verifies(world: World) -> None:
    hook = Receiver()
    async with loopback(hook) as url:
        _, hook.secret = await world.register(url, "batch.failed", "budget.threshold_reached")
        batch_id = await _fail_a_batch(world)
        kiln = world.app.state.kiln
        async with kiln.db.sessions.begin() as session:  # a monthly budget of 1000, alert at 50%
            session.add(Quota(tenant_id=world.tenant, monthly_budget_micros=1000,
                              budget_alert_percents=[50]))  # fmt: skip
        for cost in (600, 100):  # crossed once: the second settlement makes no event
            async with kiln.db.sessions.begin() as session:
                rid = f"req-{uuid.uuid4().hex}"
                row = Settled(rid, world.tenant, "UTC", cost, _now(), held=False)
                await settle(session, [row])
        async with kiln.db.sessions() as session:  # rolled back: never sent
            await events.emit(session, world.tenant, "budget.threshold_reached",
                              {"threshold_percent": 99})  # fmt: skip
            await session.rollback()
        async with kiln.db.sessions.begin() as session:  # not subscribed: never sent
            await events.emit(session, world.tenant, "batch.completed", {"id": "batch_x"})
        await _until(lambda: len(hook.seen) >= 2)
        await asyncio.sleep(0.5)  # a second delivery of either would arrive by now
    assert hook.unverified == 0
    ids = [seen[0] for seen in hook.seen]
    assert len(ids) == 2 == len(set(ids))
    by_type = {p["type"]: p for _, _, p in hook.seen}
    assert by_type.keys() == {"batch.failed", "budget.threshold_reached"}
    assert by_type["batch.failed"]["data"]["id"] == batch_id
    assert by_type["batch.failed"]["data"]["status"] == "failed"
    budget = by_type["budget.threshold_reached"]["data"]
    assert budget == {
        "tenant_id": str(world.tenant), "period": _now().strftime("%Y-%m"),
        "threshold_percent": 50, "spent_micros": 600, "limit_micros": 1000,
    }  # fmt: skip


async def test_a_receiver_failing_twice_gets_the_third_attempt_after_backoff(
    world: World,
) -> None:
    hook = Receiver(fail_first=2)
    async with loopback(hook) as url:
        endpoint, hook.secret = await world.register(url, "batch.completed")
        async with world.app.state.kiln.db.sessions.begin() as session:
            await events.emit(session, world.tenant, "batch.completed", {"id": "batch_1"})
        await _until(lambda: len(hook.seen) >= 3)
        deliveries = f"{world.base}/{endpoint}/deliveries"

        async def delivered() -> bool:
            return bool((await world.admin.get(deliveries)).json()[0]["state"] == "delivered")

        await _until(delivered)
        await asyncio.sleep(BASE_S * 2)
        assert len(hook.seen) == 3  # no fourth: the third was answered 204
        (only,) = (await world.admin.get(deliveries)).json()
        times = [t for _, t, _ in hook.seen]
        assert {i for i, _, _ in hook.seen} == {only["webhook_id"]}  # one id, retried
        # backoff with jitter in [0.5, 1): base * [0.5, 1), then 2 * base * [0.5, 1)
        assert times[1] - times[0] >= BASE_S * 0.5
        assert times[2] - times[1] >= BASE_S
        assert [a["response_code"] for a in only["log"]] == [500, 500, 204]
        assert [a["outcome"] for a in only["log"]] == ["error", "error", "delivered"]
        assert only["attempts"] == 3

        r = await world.admin.post(f"{deliveries}/{only['id']}/redeliver")
        assert r.status_code == 201, r.text
        await _until(lambda: len(hook.seen) == 4)
        assert hook.seen[3][0] == only["webhook_id"]  # the receiver dedupes by it


async def test_private_targets_are_refused_without_the_allow_setting(world: World) -> None:
    for url in (
        "http://10.0.0.1/hook",
        "http://169.254.169.254/latest",
        "http://[::1]:9/h",
        "http://192.168.1.1/",
        "http://127.0.0.2:9/hook",
        "http://224.0.0.1/",
    ):
        r = await world.admin.post(world.base, json={"url": url, "events": ["batch.failed"]})
        assert r.status_code == 400, (url, r.text)
        assert "KILN_WEBHOOK_ALLOW_NETWORKS" in r.json()["detail"]
    listed = (await world.admin.get(world.base)).json()
    assert all(e["url"].startswith("http://127.0.0.1:") for e in listed)


async def test_a_target_refused_at_delivery_is_never_contacted(world: World) -> None:
    """Registered while its network was allowed (or its name resolved elsewhere): the guard
    checks again before each delivery, so nothing reaches 127.0.0.2."""
    hook = Receiver()
    kiln = world.app.state.kiln
    async with loopback(hook, "127.0.0.2") as url:
        async with kiln.db.sessions.begin() as session:
            made = await services.create_endpoint(
                session, cli_actor(), world.tenant, EndpointCreate(url, ["batch.expired"]),
                seal=signing.webhook_seal(kiln.settings.hmac_key()),
                allow=guard.networks("127.0.0.0/8"),
            )  # fmt: skip
            await events.emit(session, world.tenant, "batch.expired", {"id": "batch_2"})
        log = f"{world.base}/{made.endpoint.id}/deliveries"

        async def refused() -> bool:
            found = (await world.admin.get(log)).json()
            return bool(found and found[0]["log"])

        await _until(refused)
    (only,) = (await world.admin.get(log)).json()
    assert only["log"][0]["outcome"] == "refused"
    assert only["state"] == "pending"  # retried later: the operator may allow it meanwhile
    assert hook.seen == []
    assert hook.unverified == 0


async def test_a_rotated_secret_signs_beside_the_new_one(world: World) -> None:
    hook = Receiver()
    async with loopback(hook) as url:
        endpoint, old = await world.register(url, "batch.cancelled")
        r = await world.admin.post(f"{world.base}/{endpoint}/rotate-secret")
        assert r.status_code == 201, r.text
        new = r.json()["secret"]
        assert new != old
        assert new.startswith("whsec_")
        hook.secret = old  # a receiver not yet updated still verifies
        async with world.app.state.kiln.db.sessions.begin() as session:
            await events.emit(session, world.tenant, "batch.cancelled", {"id": "batch_3"})
        await _until(lambda: len(hook.seen) == 1)
    assert len(hook.seen) == 1
    assert hook.unverified == 0
    body, headers = hook.raw[0]
    assert len(headers["webhook-signature"].split(" ")) == 2  # one v1 signature per secret
    Webhook(new).verify(body, headers)  # an updated receiver verifies too

    async with world.app.state.kiln.db.sessions() as session:  # sealed at rest, to its slot
        row = await session.get(WebhookEndpoint, uuid.UUID(endpoint))
    assert row is not None
    assert new.encode() not in row.secret_sealed
    assert old.encode() not in (row.previous_sealed or b"")
    seal = signing.webhook_seal(world.app.state.kiln.settings.hmac_key())
    with pytest.raises(InvalidTag):  # the rotated secret does not open as the current one
        seal.open(row.previous_sealed or b"", signing.identity(row.id))


def _now() -> datetime:
    return datetime.now(UTC)


async def test_two_gateways_send_each_delivery_once(world: World) -> None:
    """A second delivery loop on the same database (another gateway): claims are locked and
    leased, so each event still arrives once."""
    hook = Receiver()
    kiln = world.app.state.kiln
    other = WebhookSender(kiln.db.sessions, kiln.settings)
    other.start()
    try:
        async with loopback(hook) as url:
            _, hook.secret = await world.register(url, "batch.completed")
            for n in range(12):
                async with kiln.db.sessions.begin() as session:
                    await events.emit(session, world.tenant, "batch.completed", {"n": n})
            await _until(lambda: len(hook.seen) >= 12)
            await asyncio.sleep(0.5)
    finally:
        await other.stop()
    ids = [seen[0] for seen in hook.seen]
    assert len(ids) == 12 == len(set(ids))
    assert sorted(p["data"]["n"] for _, _, p in hook.seen) == list(range(12))


async def test_a_secret_that_does_not_open_fails_only_its_own_deliveries(world: World) -> None:
    """An endpoint sealed under another server secret: its delivery fails (logged per attempt)
    while the others of the same poll go out; rotating gives it a working secret."""
    hook = Receiver()
    kiln = world.app.state.kiln
    async with loopback(hook) as url:
        _, hook.secret = await world.register(url, "budget.threshold_reached")
        async with kiln.db.sessions.begin() as session:
            bad = WebhookEndpoint(tenant_id=world.tenant, url=url, secret_sealed=b"\0" * 40,
                                  events=["budget.threshold_reached"])  # fmt: skip
            session.add(bad)
            await session.flush()
            await events.emit(session, world.tenant, "budget.threshold_reached", {"n": 1})
        log = f"{world.base}/{bad.id}/deliveries"

        async def failed_once() -> bool:
            found = (await world.admin.get(log)).json()
            return bool(found and found[0]["log"])

        await _until(failed_once)
        await _until(lambda: len(hook.seen) == 1)
    (only,) = (await world.admin.get(log)).json()
    assert only["log"][0]["outcome"] == "error"
    assert "does not open" in only["log"][0]["error"]
    r = await world.admin.post(f"{world.base}/{bad.id}/rotate-secret")
    assert r.status_code == 201, r.text
    assert r.json()["endpoint"]["previous_secret_until"] is None  # nothing old to keep
