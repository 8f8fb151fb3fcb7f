"""A concurrency cap of 5, measured inside the worker: 50 simultaneous requests, never more than
5 in flight there (``kiln_worker_in_flight``, sampled throughout)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from .conftest import MINILM, KilnProcess, minilm_up

SENTENCES = [f"sentence {i} about concurrency caps shared through PostgreSQL" for i in range(16)]


def _worker_metrics_url(kiln: KilnProcess) -> str:
    (worker,) = kiln.workers()
    args = worker.cmdline()
    return f"http://127.0.0.1:{args[args.index('--port') + 1]}/metrics"


def _in_flight(text: str) -> float:
    line = next(x for x in text.splitlines() if x.startswith("kiln_worker_in_flight"))
    return float(line.split()[-1])


@pytest.fixture(scope="module")
def kiln_up(minilm_dir: Path) -> Iterator[KilnProcess]:
    """``kiln up`` with all-MiniLM-L6-v2, caching limits for 0.5 s (not 5 s to wait out)."""
    yield from minilm_up(minilm_dir, {"KILN_KEY_CACHE_TTL_S": "0.5"})


def test_concurrency_cap_holds_inside_the_worker(kiln_up: KilnProcess) -> None:
    assert "concurrency=5" in kiln_up.cli("quotas", "set", "--tenant", "acme", "--concurrency", "5")
    time.sleep(1.0)  # the gateway caches limits for KILN_KEY_CACHE_TTL_S
    metrics = _worker_metrics_url(kiln_up)
    headers = {"authorization": f"Bearer {kiln_up.key}"}
    body = {"model": MINILM, "input": SENTENCES}

    async def run() -> tuple[list[int], list[float]]:
        samples: list[float] = []
        done = asyncio.Event()
        async with httpx.AsyncClient(timeout=60) as client:

            async def sample() -> None:
                while not done.is_set():
                    scraped = await client.get(metrics, headers=kiln_up.worker_headers())
                    samples.append(_in_flight(scraped.text))

            sampler = asyncio.create_task(sample())
            results = await asyncio.gather(*(
                client.post(f"{kiln_up.base_url}/v1/embeddings", json=body, headers=headers)
                for _ in range(50)
            ))  # fmt: skip
            done.set()
            await sampler
        return [r.status_code for r in results], samples

    statuses, samples = asyncio.run(run())
    assert set(statuses) <= {200, 429}
    assert 1 <= statuses.count(200) < 50
    assert len(samples) > 5
    assert max(samples) <= 5, max(samples)
