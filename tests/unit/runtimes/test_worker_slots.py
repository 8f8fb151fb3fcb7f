"""A worker shared by gateways enforces its own limit (``--slots``): one request over it is
refused ``busy`` (retryable) before it runs, and its metrics show the limit and the peak."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import aiohttp
import msgspec
import pytest

from kiln_runtimes.protocol import ErrorReply

from .test_worker_http import GATEWAY, FakeGenerator, generate_body, start

pytestmark = pytest.mark.unit


async def test_a_request_over_the_slots_is_refused_busy_and_the_peak_stays_at_the_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    worker, server = await start(tmp_path, monkeypatch, FakeGenerator(step=0.02))
    worker.settings = dataclasses.replace(worker.settings, slots=2)
    worker.metrics.slots.set(2)
    async with aiohttp.ClientSession(headers=GATEWAY) as session:
        url = server.make_url("/generate")
        running = [await session.post(url, data=generate_body(20)) for _ in range(2)]
        async with session.post(url, data=generate_body(2)) as refused:
            reply = msgspec.msgpack.decode(await refused.read(), type=ErrorReply)
        assert (refused.status, reply.code) == (429, "busy")
        assert reply.retry_after_s is not None
        assert worker.in_flight == 2
        for response in running:
            await response.read()
            response.close()
        await asyncio.sleep(0.01)
        async with session.post(url, data=generate_body(2)) as again:  # a slot is free again
            assert again.status == 200
        async with session.get(server.make_url("/metrics")) as metrics:
            text = await metrics.text()
    assert "kiln_worker_slots 2.0" in text
    assert "kiln_worker_in_flight_peak 2.0" in text
    await server.close()
