"""Batch quotas in the real app (real PostgreSQL, a real all-MiniLM-L6-v2 worker, the openai
SDK): ``POST /v1/batches`` answers 429 naming the limit when the file's estimated tokens do not
fit under ``batch_enqueued_tokens`` beside the open batches, or under what is left today of
``batch_tokens_per_day``; a running batch whose day is spent waits (no line fails) and carries
on when there is room again; the day's count is the tokens its lines were billed for."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from sqlalchemy import func, select, text

from kiln_platform.context import Kiln
from kiln_platform.db.tables import UsageEvent
from kiln_platform.quotas.batch_policy import day_of, line_tokens
from kiln_platform.quotas.schemas import Limits
from kiln_platform.quotas.services import set_limits
from tests.asgi import asgi
from tests.e2e.conftest import MINILM
from tests.factories import CLI, make_key, make_tenant
from tests.integration.platform.batches.support import (
    finished,
    line_texts,
    minilm_app,
    sdk,
    settings_for,
    submit,
    warm,
)

BODY: dict[str, Any] = {"model": MINILM, "input": line_texts(8)}
"""Every line here: a few lines a second on one worker thread."""


@dataclass
class World:
    kiln: Kiln
    http: httpx.AsyncClient

    async def tenant(self, limits: Limits) -> tuple[uuid.UUID, openai.AsyncOpenAI]:
        """A new tenant with ``limits`` and the SDK on an inference key of it."""
        async with self.kiln.db.sessions.begin() as session:
            tenant = await make_tenant(session)
            key = await make_key(session, self.kiln.settings.hmac_key(), tenant)
        await self.limit(tenant, limits)
        return tenant, sdk(self.http, key.secret)

    async def limit(self, tenant: uuid.UUID, limits: Limits) -> None:
        async with self.kiln.db.sessions.begin() as session:
            await set_limits(session, CLI, tenant, limits)


@pytest.fixture(scope="module")
async def world(
    database_uri: str, model_cache: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[World]:
    """The app serving MiniLM, limits read afresh on every use (no cache)."""
    settings = settings_for(
        tmp_path_factory,
        database_uri,
        "batch-quota-secret",
        batch_concurrency=1,
        key_cache_ttl_s=0.0,
    )
    async with minilm_app(settings, model_cache) as made:
        transport = httpx.ASGITransport(app=asgi(made))
        async with httpx.AsyncClient(transport=transport, timeout=60) as http:
            world = World(made.state.kiln, http)
            _, sdk = await world.tenant(Limits())
            await warm(sdk)
            yield world


async def test_a_batch_past_the_enqueued_tokens_is_refused(world: World) -> None:
    each = line_tokens(BODY)
    _, sdk = await world.tenant(Limits(batch_enqueued_tokens=150 * each))
    running = await submit(sdk, [BODY] * 100)  # open while the next ones are created
    with pytest.raises(openai.RateLimitError) as refused:
        await submit(sdk, [BODY] * 60)
    assert refused.value.code == "token_limit_exceeded"
    assert f"batch_enqueued_tokens is {150 * each:,} tokens" in refused.value.message
    assert f"{100 * each:,} are enqueued in open batches" in refused.value.message
    fits = await submit(sdk, [BODY] * 50)  # exactly what is left
    with contextlib.suppress(openai.ConflictError):  # it may have completed meanwhile
        await sdk.batches.cancel(running.id)
    closed = (await finished(sdk, running.id)).status
    assert closed in {"cancelled", "completed"}  # either way, no longer enqueued
    later = await submit(sdk, [BODY] * 60)
    for batch in (fits, later):  # clean up; on a slow host one may have completed meanwhile
        with contextlib.suppress(openai.ConflictError):
            await sdk.batches.cancel(batch.id)


async def test_a_batch_past_todays_tokens_is_refused(world: World) -> None:
    _, sdk = await world.tenant(Limits(batch_tokens_per_day=10 * line_tokens(BODY) - 1))
    with pytest.raises(openai.RateLimitError) as refused:
        await submit(sdk, [BODY] * 10)
    assert refused.value.code == "token_limit_exceeded"
    assert "batch_tokens_per_day" in refused.value.message
    assert "per day" in refused.value.message
    assert refused.value.response.headers["retry-after"]  # until the tenant's next day
    assert await submit(sdk, [BODY] * 9)


async def test_a_spent_day_makes_lines_wait_not_fail(world: World) -> None:
    """The day's count runs out mid-batch (the limit is lowered below what the lines used):
    no line starts, none fails, the batch stays in progress; with room again it completes."""
    total = 40
    tenant, sdk = await world.tenant(Limits(batch_tokens_per_day=10**9))
    batch = await submit(sdk, [BODY] * total)
    deadline = time.monotonic() + 30
    while (await sdk.batches.retrieve(batch.id)).request_counts.completed < 2:  # type: ignore[union-attr]
        assert time.monotonic() < deadline, "no line done"
        await asyncio.sleep(0.05)
    await world.limit(tenant, Limits(batch_tokens_per_day=1))
    await asyncio.sleep(1.0)  # the line in flight ends
    held = await sdk.batches.retrieve(batch.id)
    await asyncio.sleep(1.5)  # ~7 polls, in which a few lines a second would have run
    still = await sdk.batches.retrieve(batch.id)
    assert (still.status, still.request_counts) == ("in_progress", held.request_counts)
    assert held.request_counts.failed == 0  # type: ignore[union-attr]
    assert held.request_counts.completed < total  # type: ignore[union-attr]
    await world.limit(tenant, Limits(batch_tokens_per_day=10**9))
    done = await finished(sdk, batch.id)
    assert (done.status, done.request_counts.completed) == ("completed", total)
    assert await _counted_today(world.kiln, tenant) == await _billed_tokens(world.kiln, batch.id)


async def _counted_today(kiln: Kiln, tenant: uuid.UUID) -> int:
    """The tenant's batch tokens today (its daily count's ``quota_counters`` row)."""
    start, _ = day_of("UTC", datetime.now(UTC))
    async with kiln.db.sessions() as session:
        used = await session.scalar(
            text("SELECT tokens FROM quota_counters WHERE subject = :s AND window_start = :d"),
            {"s": f"batch-day:tenant:{tenant}", "d": start},
        )
    return int(used or 0)


async def _billed_tokens(kiln: Kiln, batch_id: str) -> int:
    async with kiln.db.sessions() as session:
        billed = await session.scalar(
            select(func.sum(UsageEvent.input_tokens + UsageEvent.output_tokens))
            .where(UsageEvent.request_id.like(f"{batch_id}_%"))
        )  # fmt: skip
    assert billed
    return int(billed)
