"""Fair share between tenants' batches in the real app (real PostgreSQL, a real all-MiniLM-L6-v2
worker, the openai SDK): a tenant's small batch created while another tenant's big one runs is
not queued behind it; the gateway runs both, their lines taking the slots in turn."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.asgi import asgi
from tests.e2e.conftest import MINILM
from tests.factories import make_key, make_tenant
from tests.integration.platform.batches.support import (
    finished,
    line_texts,
    minilm_app,
    sdk,
    settings_for,
    submit,
    warm,
)

BIG, SMALL = 200, 20


@pytest.fixture(scope="module")
async def sdks(
    database_uri: str, model_cache: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[openai.AsyncOpenAI, openai.AsyncOpenAI]]:
    """The SDK as two tenants of the app serving MiniLM (two lines in flight per gateway)."""
    settings = settings_for(tmp_path_factory, database_uri, "fairness-secret", batch_concurrency=2)
    async with minilm_app(settings, model_cache) as made:
        async with made.state.kiln.db.sessions.begin() as session:
            keys = [await make_key(session, settings.hmac_key(), await make_tenant(session))
                    for _ in range(2)]  # fmt: skip
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi(made)),
                                     timeout=60) as http:  # fmt: skip
            a, b = (sdk(http, key.secret) for key in keys)
            await warm(a)
            yield a, b


async def test_a_small_batch_is_not_queued_behind_another_tenants_big_one(
    sdks: tuple[openai.AsyncOpenAI, openai.AsyncOpenAI],
) -> None:
    a, b = sdks
    body: dict[str, Any] = {"model": MINILM, "input": line_texts(4)}
    big = await submit(a, [body] * BIG)
    deadline = time.monotonic() + 30
    while (await a.batches.retrieve(big.id)).request_counts.completed < 5:  # type: ignore[union-attr]
        assert time.monotonic() < deadline, "the big batch did not start"
        await asyncio.sleep(0.05)
    small = await finished(b, (await submit(b, [body] * SMALL)).id)
    assert (small.status, small.request_counts.completed) == ("completed", SMALL)
    running = await a.batches.retrieve(big.id)
    assert running.status == "in_progress"  # a gateway running one batch at a time ends it first
    assert running.request_counts.completed < BIG - SMALL  # type: ignore[union-attr]
    await a.batches.cancel(big.id)  # its end is test_runner_app's and the e2e's business
    assert (await finished(a, big.id)).status == "cancelled"
