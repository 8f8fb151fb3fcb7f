"""Kill test: SIGKILL the gateway while embeddings and streamed chats are in flight, restart it on
the same data directory, and check the ledger: no request recorded twice, charge lines that add
up to each request's cost, and every request whose whole response reached the client recorded
with the token counts the client was told."""

from __future__ import annotations

import asyncio
import signal
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import psutil
from openai import AsyncOpenAI
from sqlalchemy import text

from kiln_platform.admin.authz import Actor, Role
from kiln_platform.billing.pricebooks import create_book
from kiln_platform.billing.schemas import PriceBookCreate, PriceIn
from kiln_platform.db.database import open_database
from kiln_platform.settings import Settings

from .conftest import MINILM, SMOLLM2, KilnProcess, restart_kiln

if TYPE_CHECKING:
    from collections.abc import Callable
    from contextlib import AbstractContextManager
    from pathlib import Path

MAX_LOAD_S = 90.0
MIN_ANSWERED, MIN_STREAMS = 60, 8


@dataclass(frozen=True)
class Answered:
    """A request whose whole response reached the client, and what it was told it used."""

    request_id: str
    endpoint: str
    input_tokens: int
    output_tokens: int


async def _price_book(data_dir: Path) -> None:
    book = PriceBookCreate(
        prices=[
            PriceIn("*", "input_token", "0.3"),
            PriceIn("*", "output_token", "1.7"),
            PriceIn("*", "request", "10"),
            PriceIn("*", "compute_second", "250"),
        ],
        effective_from=datetime.now(UTC) - timedelta(days=1),
    )
    async with open_database(Settings(data_dir=data_dir)) as db, db.sessions.begin() as session:
        await create_book(session, Actor("cli:test", Role.PLATFORM_ADMIN, None), book)


async def _embed(client: AsyncOpenAI, i: int) -> Answered:
    raw = await client.embeddings.with_raw_response.create(
        model=MINILM, input=[f"kill test {i} " * (1 + i % 5), "and a second input"]
    )
    usage = raw.parse().usage
    return Answered(raw.headers["x-request-id"], "embeddings", usage.prompt_tokens, 0)


async def _chat(client: AsyncOpenAI, i: int) -> Answered:
    raw = await client.chat.completions.with_raw_response.create(
        model=SMOLLM2,
        messages=[{"role": "user", "content": f"Count from {i} upwards."}],
        max_tokens=24 + i % 24,
        stream=True,
        stream_options={"include_usage": True},
    )
    usage = None
    async for chunk in raw.parse():  # raises if the stream ends before [DONE]
        usage = chunk.usage or usage
    assert usage is not None
    return Answered(
        raw.headers["x-request-id"], "chat.completions", usage.prompt_tokens,
        usage.completion_tokens,
    )  # fmt: skip


async def _load(kiln: KilnProcess) -> tuple[list[Answered], int]:
    """Embeddings and streamed chats from 20 loops until the gateway is killed under them."""
    client = AsyncOpenAI(base_url=f"{kiln.base_url}/v1", api_key=kiln.key, max_retries=0)
    answered: list[Answered] = []
    failures = 0
    stop, enough = asyncio.Event(), asyncio.Event()

    async def loop(call: Callable[[AsyncOpenAI, int], Any], n: int) -> None:
        nonlocal failures
        i = n * 1000
        while not stop.is_set():
            i += 1
            try:
                answered.append(await call(client, i))
                streams = sum(a.endpoint == "chat.completions" for a in answered)
                if len(answered) >= MIN_ANSWERED and streams >= MIN_STREAMS:
                    enough.set()
            except Exception:  # cut by the kill: its response did not reach us
                failures += 1
                await asyncio.sleep(0.05)

    loops = [loop(_embed, n) for n in range(12)] + [loop(_chat, n) for n in range(8)]
    tasks = [asyncio.create_task(c) for c in loops]
    await asyncio.wait_for(enough.wait(), MAX_LOAD_S)
    assert failures == 0, "requests failed before the kill"
    kiln.proc.send_signal(signal.SIGKILL)  # with 20 requests in flight
    kiln.proc.wait(timeout=10)
    await asyncio.sleep(1.0)
    stop.set()
    await asyncio.gather(*tasks)
    await client.close()
    return answered, failures


async def _ledger(data_dir: Path) -> tuple[dict[str, tuple[Any, ...]], list[Any], list[Any]]:
    settings = Settings(data_dir=data_dir)
    async with open_database(settings, upgrade=False) as db, db.sessions() as session:
        rows = (
            await session.execute(
                text(
                    "SELECT request_id, endpoint, status, input_tokens, output_tokens,"
                    " cost_micros, price_book_version FROM usage_events"
                )
            )
        ).all()
        twice = (
            await session.execute(
                text(
                    "SELECT request_id FROM usage_charges GROUP BY request_id, unit"
                    " HAVING count(*) > 1"
                )
            )
        ).all()
        unbalanced = (
            await session.execute(
                text(
                    "SELECT e.request_id FROM usage_events e"
                    " LEFT JOIN usage_charges c USING (request_id)"
                    " GROUP BY e.request_id, e.cost_micros, e.list_cost_micros"
                    " HAVING coalesce(sum(c.cost_micros), 0) <> e.cost_micros"
                    " OR coalesce(sum(c.list_cost_micros), 0) <> e.list_cost_micros"
                )
            )
        ).all()
    by_id: dict[str, tuple[Any, ...]] = {}
    for row in rows:
        assert row[0] not in by_id, f"{row[0]} recorded twice"
        by_id[row[0]] = tuple(row[1:])
    return by_id, list(twice), list(unbalanced)


def test_sigkill_loses_no_answered_request_and_records_none_twice(
    start_kiln: Callable[..., KilnProcess],
    kiln_data_dir: Callable[[], AbstractContextManager[Path]],
    minilm_dir: Path,
    smollm2_dir: Path,
) -> None:
    with kiln_data_dir() as data_dir:
        kiln = start_kiln(data_dir, [minilm_dir, smollm2_dir], {"KILN_KEY_CACHE_TTL_S": "0.5"})
        restarted = None
        orphans: list[psutil.Process] = []
        try:
            kiln.cli("tenants", "create", "acme")
            kiln.env["TEST_KEY"] = kiln.cli("keys", "create", "--tenant", "acme").split()[-1]
            asyncio.run(_price_book(data_dir))
            kiln.wait_until_serving(MINILM)
            kiln.wait_until_serving(SMOLLM2, path="completions")
            orphans = kiln.workers()
            answered, failures = asyncio.run(_load(kiln))
            restarted = restart_kiln(kiln)
            restarted.wait_until_serving(MINILM)
            ledger, twice, unbalanced = asyncio.run(_ledger(data_dir))
        finally:
            if restarted is not None and restarted.proc.poll() is None:
                restarted.stop()
            elif kiln.proc.poll() is None:
                kiln.stop()
            for worker in orphans:  # the killed gateway's workers
                if worker.is_running():
                    worker.kill()

    streams = [a for a in answered if a.endpoint == "chat.completions"]
    assert len(answered) >= MIN_ANSWERED
    assert len(streams) >= MIN_STREAMS
    assert failures >= 1, "the kill cut no request in flight"
    assert twice == []
    assert unbalanced == []
    missing = [a.request_id for a in answered if a.request_id not in ledger]
    assert missing == [], f"{len(missing)} answered requests not in the ledger"
    for a in answered:
        endpoint, status, input_tokens, output_tokens, cost, book = ledger[a.request_id]
        assert (endpoint, status, input_tokens, output_tokens) == (
            a.endpoint, 200, a.input_tokens, a.output_tokens,
        ), a  # fmt: skip
        assert book == 1
        assert cost > 0
