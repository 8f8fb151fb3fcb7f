"""A stream's concurrency lease and budget hold live as long as it does, and it has a deadline,
against a real ``kiln up`` (SmolLM2) with a lease TTL far shorter than the stream.

Settings: ``KILN_LEASE_TTL_S=0.6`` and ``KILN_REQUEST_TIMEOUT_S=5`` (a lease is written to live
5.6 s; only renewal keeps it longer), ``KILN_STREAM_TIMEOUT_S=10``. One stream of up to 2000
tokens, for a tenant with a concurrency limit of 1 and a budget: at 7 s (past its lease's written
life) a second request is refused and its lease and hold are both present; at 10 s it ends with
``finish_reason: "length"``, billed for the tokens it streamed; then no lease or hold is left,
the worker has nothing in flight, and the tenant's next request is admitted.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from .conftest import SMOLLM2, KilnProcess, _start_kiln, data_dir, serve_model

ENV = {
    "KILN_LEASE_TTL_S": "0.6",
    "KILN_REQUEST_TIMEOUT_S": "5",  # also each read of a stream: room for a loaded machine
    "KILN_STREAM_TIMEOUT_S": "10",
    "KILN_KEY_CACHE_TTL_S": "0.5",
}
PRICES = [
    {"model": SMOLLM2, "unit": "input_token", "unit_price_micros": "1"},
    {"model": SMOLLM2, "unit": "output_token", "unit_price_micros": "1"},
]
STORY: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "Write a very long, detailed story about a lighthouse."}
]


@pytest.fixture(scope="module")
def kiln(smollm2_dir: Path) -> Iterator[KilnProcess]:
    """SmolLM2 with the short TTL and deadline, a price book, and tenant ``acme`` limited to one
    request at a time with a budget."""
    with data_dir() as path:
        for proc in serve_model(_start_kiln(path, [smollm2_dir], ENV), SMOLLM2, "completions"):
            proc.cli("tenants", "create", "ops")
            admin = proc.cli("keys", "create", "--tenant", "ops", "--scope", "admin:write",
                             "--role", "platform-admin").strip().splitlines()[-1]  # fmt: skip
            book = {"prices": PRICES, "effective_from": "2020-01-01T00:00:00Z"}
            r = httpx.post(f"{proc.base_url}/admin/v1/price-books", json=book, timeout=30,
                           headers={"authorization": f"Bearer {admin}"})  # fmt: skip
            assert r.status_code < 300, r.text
            proc.cli("quotas", "set", "--tenant", "acme", "--concurrency", "1",
                     "--monthly-budget", "1000")  # fmt: skip
            time.sleep(1.0)  # the limit and price-book caches
            yield proc


def _held(kiln: KilnProcess) -> tuple[int, int]:
    """(concurrency leases, budget holds) in the database."""
    ((leases,),) = kiln.sql("SELECT count(*) FROM quota_leases")
    ((holds,),) = kiln.sql("SELECT count(*) FROM budget_reservations")
    return leases, holds


def _in_flight(kiln: KilnProcess) -> float:
    (worker,) = kiln.workers()
    args = worker.cmdline()
    url = f"http://127.0.0.1:{args[args.index('--port') + 1]}/metrics"
    line = next(
        x
        for x in httpx.get(url, headers=kiln.worker_headers()).text.splitlines()
        if x.startswith("kiln_worker_in_flight")
    )
    return float(line.split()[-1])


def _second(kiln: KilnProcess) -> int:
    r = httpx.post(
        f"{kiln.base_url}/v1/completions",
        json={"model": SMOLLM2, "prompt": "Hi", "max_tokens": 1},
        headers={"authorization": f"Bearer {kiln.key}"},
        timeout=30,
    )
    return r.status_code


def test_a_stream_keeps_its_lease_and_hold_until_its_deadline(kiln: KilnProcess) -> None:
    client = openai.OpenAI(base_url=f"{kiln.base_url}/v1", api_key=kiln.key, max_retries=0)
    start = time.monotonic()
    stream = client.chat.completions.create(
        model=SMOLLM2, messages=STORY, max_tokens=2000, temperature=0.9, seed=7, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks: list[Any] = []
    during: tuple[int, tuple[int, int]] | None = None
    for chunk in stream:
        chunks.append(chunk)
        if during is None and time.monotonic() - start > 7.0:  # past the lease's written life
            during = (_second(kiln), _held(kiln))
    elapsed = time.monotonic() - start
    assert during is not None, f"the stream ended after {elapsed:.1f} s"
    assert during == (429, (1, 1))  # refused at the limit of 1; its lease and hold present
    finishes = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finishes == ["length"]
    assert 9.5 < elapsed < 13.0, elapsed
    usage = chunks[-1].usage
    streamed = sum(1 for c in chunks if c.choices and c.choices[0].delta.content)
    assert 0 < usage.completion_tokens < 2000
    assert usage.completion_tokens >= streamed - 1  # every piece counted (a piece may be 2 tokens)
    billed = "SELECT sum(output_tokens) FROM usage_events WHERE status = 200 AND output_tokens > 1"
    ((cost,),) = kiln.sql(billed)
    assert cost == usage.completion_tokens  # billed for what it produced
    deadline = time.monotonic() + 5
    while _held(kiln) != (0, 0) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _held(kiln) == (0, 0)
    deadline = time.monotonic() + 5  # the worker sees the cancel at its next step
    while _in_flight(kiln) != 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _in_flight(kiln) == 0  # the worker's sequence was cancelled: its slot is free
    assert _second(kiln) == 200
