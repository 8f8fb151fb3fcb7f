"""Tokens per minute, enforced across two real gateway processes that share one PostgreSQL.

Both ``kiln up`` processes use one data directory (store, server secret) and one database, and
each runs its own worker for all-MiniLM-L6-v2. A tenant limited to 40 tokens/min sends 4-token
embeddings requests, two at a time (one to each gateway): about 10 are admitted in all.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from kiln_platform.db.engine import embedded_server

from .pgdata import copy_migrated_pg

MODEL = "all-minilm-l6-v2"


@pytest.fixture(scope="module")
def two_gateways(minilm_dir: Path, start_kiln: Any, kiln_data_dir: Any) -> Iterator[list[Any]]:
    pg = copy_migrated_pg(Path(tempfile.mkdtemp(prefix="kiln-pg-")) / "pg")
    with kiln_data_dir() as data, embedded_server(pg) as uri:
        env = {"KILN_DATABASE_URL": uri, "KILN_SECRET_KEY": "shared-secret",
               "KILN_KEY_CACHE_TTL_S": "0.5"}  # fmt: skip
        first = start_kiln(data, [minilm_dir], env)
        second = None
        try:
            first.cli("tenants", "create", "tpm")
            first.env["TEST_KEY"] = first.cli("keys", "create", "--tenant", "tpm").splitlines()[-1]
            first.wait_until_serving(MODEL)
            second = start_kiln(data, [], env)
            second.env["TEST_KEY"] = first.key
            second.wait_until_serving(MODEL)
            yield [first, second]
        finally:
            for kiln in (first, second):
                if kiln is not None and kiln.proc.poll() is None:
                    kiln.stop()


def test_tokens_per_minute_is_shared_by_two_gateways(two_gateways: list[Any]) -> None:
    first, second = two_gateways
    assert "tpm=40" in second.cli("quotas", "set", "--tenant", "tpm", "--tpm", "40")
    time.sleep(1.0)  # both gateways cached the key's (unlimited) quotas while warming up: 0.5 s
    if time.time() % 60 > 30:  # keep the run inside one fixed window
        time.sleep(61 - time.time() % 60)
    headers = {"authorization": f"Bearer {first.key}"}
    body = {"model": MODEL, "input": "hello world"}  # [CLS] hello world [SEP]: 4 tokens

    async def run() -> list[httpx.Response]:
        out: list[httpx.Response] = []
        async with httpx.AsyncClient(timeout=30) as client:
            for _ in range(15):  # waves of two, one request to each gateway
                out += await asyncio.gather(
                    *(
                        client.post(f"{k.base_url}/v1/embeddings", json=body, headers=headers)
                        for k in two_gateways
                    )
                )
                await asyncio.sleep(0.3)  # usage is charged just after each response
        return out

    responses = asyncio.run(run())
    ok = [r for r in responses if r.status_code == 200]
    assert all(r.json()["usage"]["prompt_tokens"] == 4 for r in ok)
    assert 10 <= len(ok) <= 11, len(ok)  # 40 tokens; a wave may overshoot by its own size
    assert {r.url.port for r in ok} == {httpx.URL(k.base_url).port for k in two_gateways}
    limited = [r for r in responses if r.status_code == 429]
    assert len(ok) + len(limited) == 30
    for r in limited:
        assert r.json()["error"]["code"] == "rate_limit_exceeded"
        assert r.headers["x-ratelimit-limit-tokens"] == "40"
        assert int(r.headers["retry-after"]) >= 1
