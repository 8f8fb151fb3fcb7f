"""A real worker process on all-MiniLM-L6-v2: an express request stops the long batch that is
running, runs first, and the stopped batch runs again to the same result."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import msgspec
import numpy as np
import pytest

from kiln_runtimes.protocol import (
    CONTENT_TYPE,
    WORKER_SECRET_ENV,
    EmbedRequest,
    EmbedResult,
    WorkerInfo,
)

from .conftest import free_port

SECRET = "preemption-test-worker-secret"
GATEWAY = {"Authorization": f"Bearer {SECRET}"}
LONG = [[1000 + (7 * i + j) % 20000 for j in range(128)] for i in range(64)]


@pytest.fixture(scope="module")
def worker(minilm_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port, log = free_port(), tmp_path_factory.mktemp("preempt") / "worker.log"
    command = [sys.executable, "-m", "kiln_runtimes", "--model-dir", str(minilm_dir)]
    command += ["--port", str(port), "--threads", "1", "--max-batch-size", "64"]
    env = {**os.environ, WORKER_SECRET_ENV: SECRET}
    process = subprocess.Popen(command, stderr=log.open("wb"), stdout=subprocess.DEVNULL, env=env)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(30)


@pytest.fixture
async def session(worker: str) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(base_url=worker, headers=GATEWAY) as client:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                async with client.get("/health") as r:
                    if msgspec.msgpack.decode(await r.read(), type=WorkerInfo).ready:
                        break
            except aiohttp.ClientConnectionError:
                pass
            await asyncio.sleep(0.1)
        yield client


async def embed(
    session: aiohttp.ClientSession, request_id: str, ids: list[list[int]], *, express: bool = False
) -> tuple[np.ndarray, float]:
    body = msgspec.msgpack.encode(
        EmbedRequest(request_id=request_id, input_ids=ids, express=express)
    )
    async with session.post("/embed", data=body, headers={"Content-Type": CONTENT_TYPE}) as r:
        assert r.status == 200, await r.read()
        result = msgspec.msgpack.decode(await r.read(), type=EmbedResult)
    rows = np.frombuffer(result.data, "<f4").reshape(len(ids), result.dimensions)
    return rows, time.monotonic()


async def preempted(session: aiohttp.ClientSession) -> float:
    async with session.get("/metrics") as r:
        text = await r.text()
    line = next(x for x in text.splitlines() if x.startswith("kiln_worker_preempted_batches_total"))
    return float(line.split()[-1])


async def test_express_request_stops_the_running_batch(session: aiohttp.ClientSession) -> None:
    reference, _ = await embed(session, "warm-1", LONG)  # also teaches the latency model
    started = time.monotonic()
    _, done = await embed(session, "warm-2", LONG)
    one_run = done - started

    started = time.monotonic()
    long = asyncio.create_task(embed(session, "long", LONG))
    await asyncio.sleep(0.05)
    short_rows, short_done = await embed(session, "short", [[101, 7592, 102]], express=True)
    long_rows, long_done = await long
    assert short_done - started < one_run / 2, "the express request waited for the batch"
    assert short_done < long_done
    assert await preempted(session) == 1.0
    np.testing.assert_allclose(long_rows, reference, rtol=0, atol=1e-6)
    alone, _ = await embed(session, "alone", [[101, 7592, 102]])
    np.testing.assert_allclose(short_rows, alone, rtol=0, atol=1e-6)
