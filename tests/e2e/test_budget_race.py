"""Budgets against a real ``kiln up`` through the official ``openai`` SDK.

- 50 simultaneous embeddings requests against a budget that fits exactly 10: exactly 10 are
  admitted, 40 refused with 429 ``insufficient_quota``, and the month's spend equals the ledger's
  cost for the tenant, never more than the budget.
- A streamed chat completion holds its worst case (prompt + ``max_tokens``) while it runs, which
  refuses a request that would only fit without the hold; at its end the hold settles to the
  actual cost, and the same request fits.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from sqlalchemy import text
from tokenizers import Tokenizer

from kiln_platform.db.database import open_database
from kiln_platform.settings import Settings

from .conftest import MINILM, SMOLLM2, KilnProcess

TEXT = "The quick brown fox jumps over the lazy dog."
PRICES = [  # micro-units
    {"model": MINILM, "unit": "input_token", "unit_price_micros": "1000"},
    {"model": MINILM, "unit": "request", "unit_price_micros": "500"},
    {"model": SMOLLM2, "unit": "input_token", "unit_price_micros": "10"},
    {"model": SMOLLM2, "unit": "output_token", "unit_price_micros": "100"},
]
MESSAGES: Any = [{"role": "user", "content": "Reply with exactly one word: hello"}]


@pytest.fixture(scope="module")
def kiln(both_models: Callable[..., AbstractContextManager[KilnProcess]]) -> Iterator[KilnProcess]:
    """Both bundled models, a platform-admin key, and a price book in effect."""
    with both_models({"KILN_KEY_CACHE_TTL_S": "0.5"}) as proc:
        proc.cli("tenants", "create", "ops")
        proc.env["ADMIN_KEY"] = proc.new_key("ops", "--scope", "admin:write", "--scope",
                                     "inference", "--role", "platform-admin")  # fmt: skip
        proc.env["TEST_KEY"] = proc.env["ADMIN_KEY"]  # wait_until_serving: no budget
        _admin(proc, "POST", "/admin/v1/price-books",
               {"prices": PRICES, "effective_from": "2020-01-01T00:00:00Z"})  # fmt: skip
        proc.wait_until_serving(MINILM)
        proc.wait_until_serving(SMOLLM2, path="completions")
        yield proc


def _admin(kiln: KilnProcess, method: str, path: str, body: Any = None) -> Any:
    r = httpx.request(method, kiln.base_url + path, json=body, timeout=30,
                      headers={"authorization": f"Bearer {kiln.env['ADMIN_KEY']}"})  # fmt: skip
    assert r.status_code < 300, r.text
    return r.json()


def _tenant_with_budget(kiln: KilnProcess, name: str, budget: int) -> tuple[str, str]:
    """A tenant, its inference key, and its budget (in effect once the limit caches expire)."""
    tenant = _admin(kiln, "POST", "/admin/v1/tenants", {"name": name})["id"]
    _admin(kiln, "PUT", f"/admin/v1/quotas/{tenant}", {"monthly_budget_micros": budget})
    key = kiln.new_key(name)
    time.sleep(1.0)  # the price-book and limit caches (KILN_KEY_CACHE_TTL_S=0.5)
    return tenant, key


def _client(kiln: KilnProcess, key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{kiln.base_url}/v1", api_key=key, max_retries=0)


async def _ledger_cost(kiln: KilnProcess, tenant: str) -> tuple[int, int]:
    """(requests, cost) the ledger recorded for the tenant."""
    settings = Settings(data_dir=Path(kiln.env["KILN_DATA_DIR"]))
    async with open_database(settings) as db, db.sessions() as session:
        row = (
            await session.execute(
                text(
                    "SELECT count(*), coalesce(sum(cost_micros), 0) FROM usage_events"
                    " WHERE tenant_id = CAST(:t AS uuid)"
                ),
                {"t": tenant},
            )
        ).one()
    return int(row[0]), int(row[1])


def _budget(kiln: KilnProcess, tenant: str) -> dict[str, Any]:
    budget: dict[str, Any] = _admin(kiln, "GET", f"/admin/v1/quotas/{tenant}")["budget"]
    return budget


async def test_fifty_simultaneous_requests_against_a_budget_that_fits_ten(
    kiln: KilnProcess, minilm_dir: Path
) -> None:
    tokens = len(Tokenizer.from_file(str(minilm_dir / "tokenizer.json")).encode(TEXT).ids)
    cost = tokens * 1000 + 500
    tenant, key = _tenant_with_budget(kiln, "racer", 10 * cost)
    client = _client(kiln, key)

    async def one() -> int | str:
        try:
            await client.embeddings.create(model=MINILM, input=TEXT)
        except openai.RateLimitError as exc:
            return str(exc.code)
        return 200

    outcomes = await asyncio.gather(*(one() for _ in range(50)))
    assert outcomes.count(200) == 10
    assert outcomes.count("insufficient_quota") == 40
    budget = _budget(kiln, tenant)
    requests, ledger = await _ledger_cost(kiln, tenant)
    assert (requests, ledger) == (10, 10 * cost)
    assert budget["spent_micros"] == ledger <= budget["limit_micros"]
    assert budget["reserved_micros"] == 0
    assert [e["threshold_percent"] for e in budget["events"]] == [50, 80, 100]


async def test_a_stream_holds_its_worst_case_and_settles_to_its_actual_cost(
    kiln: KilnProcess,
) -> None:
    probe = await _client(kiln, kiln.env["ADMIN_KEY"]).chat.completions.create(
        model=SMOLLM2, messages=MESSAGES, max_tokens=1
    )
    assert probe.usage is not None
    prompt = probe.usage.prompt_tokens
    max_tokens = 400
    worst, small = prompt * 10 + max_tokens * 100, prompt * 10 + 1 * 100
    tenant, key = _tenant_with_budget(kiln, "streamer", worst + small - 1)  # not both at once
    client = _client(kiln, key)
    stream = await client.chat.completions.create(
        model=SMOLLM2, messages=MESSAGES, max_tokens=max_tokens, temperature=0.0,
        stream=True, stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = aiter(stream)
    await anext(chunks)  # admitted and running
    held = _budget(kiln, tenant)
    assert (held["spent_micros"], held["reserved_micros"]) == (0, worst)
    with pytest.raises(openai.RateLimitError) as refused:
        await client.chat.completions.create(model=SMOLLM2, messages=MESSAGES, max_tokens=1)
    assert refused.value.code == "insufficient_quota"
    assert refused.value.response.headers["x-should-retry"] == "false"
    usage = None
    async for chunk in chunks:
        usage = chunk.usage or usage
    assert usage is not None
    assert usage.completion_tokens < max_tokens  # the model stops by itself
    actual = prompt * 10 + usage.completion_tokens * 100
    settled = _budget(kiln, tenant)
    assert (settled["spent_micros"], settled["reserved_micros"]) == (actual, 0)
    assert await _ledger_cost(kiln, tenant) == (1, actual)
    fits = await client.chat.completions.create(model=SMOLLM2, messages=MESSAGES, max_tokens=1)
    assert fits.usage is not None
    assert _budget(kiln, tenant)["spent_micros"] == actual + small
