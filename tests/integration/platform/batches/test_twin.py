"""Batch lines run in the pool's background twin (``KILN_BATCH_TWIN``, on by default): the same
version on a worker of its own at idle CPU priority, while interactive requests keep the served
pool's worker (real app, real PostgreSQL, real all-MiniLM-L6-v2 workers, the openai SDK)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import REGISTRY

from kiln_platform.context import Kiln
from tests.asgi import asgi
from tests.e2e.conftest import MINILM
from tests.factories import make_key, make_tenant
from tests.integration.platform.batches.support import (
    finished,
    minilm_app,
    sdk,
    settings_for,
    submit,
    warm,
)
from tests.integration.platform.pools.test_local_workers import policies

LINES = 6


@pytest.fixture(scope="module")
async def app(
    database_uri: str, model_cache: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Any]:
    """The app serving MiniLM with the default twin setting, and a tenant's key."""
    settings = settings_for(tmp_path_factory, database_uri, "twin-secret")
    assert settings.batch_twin
    async with minilm_app(settings, model_cache) as made:
        async with made.state.kiln.db.sessions.begin() as session:
            tenant = await make_tenant(session)
            made.state.key = await make_key(session, settings.hmac_key(), tenant)
        yield made


def _admitted(version: str) -> float:
    """Requests the scheduler of MiniLM's pool labelled ``version`` admitted, every tenant's."""
    return sum(
        sample.value
        for family in REGISTRY.collect()
        if family.name == "kiln_scheduler_admitted"
        for sample in family.samples
        if sample.labels.get("model") == MINILM and sample.labels.get("version") == version
    )


async def test_batch_lines_run_in_the_idle_twin_and_requests_in_the_served_pool(app: Any) -> None:
    kiln: Kiln = app.state.kiln
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi(app)), timeout=60) as h:
        client = sdk(h, app.state.key.secret)
        await warm(client)
        online = _admitted("1")
        batch = await submit(
            client, [{"model": MINILM, "input": f"line {i}"} for i in range(LINES)]
        )
        done = await finished(client, batch.id)
        assert (done.status, done.request_counts.completed) == ("completed", LINES)
        await client.embeddings.create(model=MINILM, input="interactive, after the batch")
    assert _admitted("1+batch") == LINES
    assert _admitted("1") == online + 1  # the request after; none of the lines
    served, twin = (kiln.pools.backend.ready(f"{MINILM}@{v}") for v in ("1", "1+batch"))
    assert [w.spec.idle for w in served + twin] == [False, True]
    pids = [w.process.pid for w in served + twin if w.process is not None]
    assert policies(pids[0]) == {os.SCHED_OTHER}
    assert policies(pids[1]) == {os.SCHED_IDLE}
