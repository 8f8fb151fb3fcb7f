"""The worker's HTTP behaviour in-process, with a made-up generation backend."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import msgspec
import pytest
from aiohttp import web

from kiln_platform.errors import ServiceUnavailable
from kiln_platform.gateway import dispatch
from kiln_runtimes import _runtime
from kiln_runtimes._app import create_app, metrics_app
from kiln_runtimes._errors import Overloaded, WorkerError
from kiln_runtimes._runtime import Worker
from kiln_runtimes._settings import WorkerSettings
from kiln_runtimes.backends.base import EngineHealth
from kiln_runtimes.protocol import (
    CONTENT_TYPE,
    ErrorReply,
    GenerateChunk,
    GenerateRequest,
    ModelManifest,
    WorkerInfo,
)

SECRET = "worker-secret-for-tests"
GATEWAY = {"Authorization": f"Bearer {SECRET}"}
"""What the gateway's calls carry (``pools.backend.worker_headers``)."""
MANIFEST = ModelManifest(
    name="fake-llm", task="generate", engine="onnxruntime-genai", context_length=64
)


class FakeGenerator:
    """Yields one token id per step; records how far it got and whether it was closed."""

    def __init__(
        self, step: float = 0.005, fail_at: int | None = None, refuse: WorkerError | None = None
    ) -> None:
        self.step, self.fail_at, self.refuse = step, fail_at, refuse
        self.yielded = 0
        self.closed = asyncio.Event()

    def load(self, model_dir: Path, manifest: ModelManifest) -> None:
        pass

    def warmup(self) -> None:
        pass

    async def stream(self, request: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        try:
            if self.refuse is not None:
                raise self.refuse
            for n in range(request.max_tokens):
                await asyncio.sleep(self.step)
                if n == self.fail_at:
                    raise RuntimeError("decode step failed")
                self.yielded += 1
                last = n == request.max_tokens - 1
                yield GenerateChunk(
                    request_id=request.request_id,
                    token_ids=[100 + n],
                    finish_reason="length" if last else None,
                    prompt_tokens=len(request.prompt_ids),
                    completion_tokens=n + 1,
                )
        finally:
            self.closed.set()

    def health(self) -> EngineHealth:
        return EngineHealth(loaded=True, running=1)

    def unload(self) -> None:
        pass


@dataclass
class Server:
    """A worker app served the way ``worker.serve`` does (no handler cancellation)."""

    runner: web.AppRunner
    base: str

    def make_url(self, path: str) -> str:
        return f"{self.base}{path}"

    async def close(self) -> None:
        await self.runner.cleanup()


async def start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: FakeGenerator, *, load: bool = True
) -> tuple[Worker, Server]:
    settings = WorkerSettings(
        model_dir=tmp_path,
        model=None,
        version="7",
        host="127.0.0.1",
        port=0,
        max_batch_size=4,
        max_wait=0.005,
        threads=1,
        max_queue=8,
        log_level="info",
        secret=SECRET,
    )
    monkeypatch.setattr(_runtime, "create_backend", lambda manifest, options: backend)
    worker = Worker(settings, MANIFEST)
    runner = web.AppRunner(create_app(worker), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    if load:
        await worker.load()
    return worker, Server(runner, f"http://{host}:{port}")


def parse_frames(body: bytes) -> list[GenerateChunk]:
    chunks = []
    while body:
        size = int.from_bytes(body[:4], "big")
        chunks.append(msgspec.msgpack.decode(body[4 : 4 + size], type=GenerateChunk))
        body = body[4 + size :]
    return chunks


def generate_body(max_tokens: int, prompt: list[int] | None = None) -> bytes:
    request = GenerateRequest(
        request_id="gen-1", prompt_ids=prompt or [1, 2, 3], max_tokens=max_tokens
    )
    return msgspec.msgpack.encode(request)


async def test_health_is_503_while_loading_then_200(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    worker, server = await start(tmp_path, monkeypatch, FakeGenerator(), load=False)
    async with aiohttp.ClientSession(headers=GATEWAY) as session:
        async with session.get(server.make_url("/health")) as response:
            info = msgspec.msgpack.decode(await response.read(), type=WorkerInfo)
        assert response.status == 503
        assert not info.ready
        async with session.post(server.make_url("/generate"), data=generate_body(2)) as response:
            reply = msgspec.msgpack.decode(await response.read(), type=ErrorReply)
        assert response.status == 503
        assert reply.code == "overloaded"
        assert reply.retry_after_s == 1.0
        await worker.load()
        async with session.get(server.make_url("/health")) as response:
            info = msgspec.msgpack.decode(await response.read(), type=WorkerInfo)
        assert response.status == 200
        assert (info.task, info.ready, info.free_slots) == ("generate", True, 3)
    await server.close()


async def test_generate_streams_length_prefixed_frames(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = FakeGenerator()
    _, server = await start(tmp_path, monkeypatch, backend)
    async with (
        aiohttp.ClientSession(headers=GATEWAY) as session,
        session.post(server.make_url("/generate"), data=generate_body(4)) as response,
    ):
        assert response.status == 200
        assert response.headers["Content-Type"] == CONTENT_TYPE
        chunks = parse_frames(await response.read())
    assert [c.token_ids for c in chunks] == [[100], [101], [102], [103]]
    assert [c.finish_reason for c in chunks] == [None, None, None, "length"]
    assert chunks[-1].completion_tokens == 4
    assert backend.closed.is_set()
    await server.close()


async def test_client_disconnect_closes_the_backend_stream_within_a_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = FakeGenerator(step=0.01)
    worker, server = await start(tmp_path, monkeypatch, backend)
    async with aiohttp.ClientSession(headers=GATEWAY) as session:
        response = await session.post(server.make_url("/generate"), data=generate_body(1000))
        size = int.from_bytes(await response.content.readexactly(4), "big")
        await response.content.readexactly(size)
        response.close()
        await asyncio.wait_for(backend.closed.wait(), timeout=1.0)
        assert backend.yielded < 10
        await asyncio.sleep(0.05)  # let the handler return and be counted
        async with session.get(server.make_url("/metrics")) as metrics:
            text = await metrics.text()
    assert 'kiln_worker_requests_total{endpoint="/generate",outcome="cancelled"} 1.0' in text
    assert "kiln_worker_running_sequences 1.0" in text
    assert "kiln_worker_waiting_sequences 0.0" in text
    assert worker.in_flight == 0
    await server.close()


async def test_failure_mid_stream_ends_with_an_error_chunk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, server = await start(tmp_path, monkeypatch, FakeGenerator(fail_at=2))
    async with (
        aiohttp.ClientSession(headers=GATEWAY) as session,
        session.post(server.make_url("/generate"), data=generate_body(5)) as response,
    ):
        assert response.status == 200
        chunks = parse_frames(await response.read())
    assert [c.finish_reason for c in chunks] == [None, None, "error"]
    await server.close()


@pytest.mark.parametrize(
    ("backend", "body", "expected"),
    [
        (FakeGenerator(refuse=Overloaded("full", 0.5)), generate_body(3), (429, "overloaded")),
        (FakeGenerator(), generate_body(0), (400, "bad_request")),
        (FakeGenerator(), generate_body(3, prompt=list(range(64))), (400, "bad_request")),
        (FakeGenerator(), b"\x93garbage", (400, "bad_request")),
    ],
)
async def test_refusals_before_the_first_chunk_are_error_replies(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    backend: FakeGenerator,
    body: bytes,
    expected: tuple[int, str],
) -> None:
    _, server = await start(tmp_path, monkeypatch, backend)
    async with (
        aiohttp.ClientSession(headers=GATEWAY) as session,
        session.post(server.make_url("/generate"), data=body) as response,
    ):
        reply = msgspec.msgpack.decode(await response.read(), type=ErrorReply)
    assert (response.status, reply.code) == expected
    await server.close()


async def test_draining_refuses_new_streams_and_waits_for_running_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    worker, server = await start(tmp_path, monkeypatch, FakeGenerator(step=0.02))
    async with aiohttp.ClientSession(headers=GATEWAY) as session:
        running = await session.post(server.make_url("/generate"), data=generate_body(10))
        assert running.status == 200  # headers are sent with the first chunk: it is in flight
        drained = asyncio.create_task(worker.drain())
        async with session.post(server.make_url("/generate"), data=generate_body(1)) as refused:
            assert refused.status == 503
            reply = msgspec.msgpack.decode(await refused.read(), type=ErrorReply)
            assert reply.code == "draining"
        assert not drained.done()
        chunks = parse_frames(await running.read())
        assert chunks[-1].finish_reason == "length"
        await asyncio.wait_for(drained, timeout=1.0)
    await server.close()


@pytest.mark.parametrize(
    "authorization",
    [None, "", f"Bearer {SECRET[:-1]}", f"Bearer {SECRET}x", SECRET, f"bearer {SECRET}",
     "Bearer \u00e9t\u00e9"],
)  # fmt: skip
async def test_calls_without_the_secret_are_refused_before_anything_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, authorization: str | None
) -> None:
    backend = FakeGenerator()
    _, server = await start(tmp_path, monkeypatch, backend)
    headers = {} if authorization is None else {"Authorization": authorization}
    async with aiohttp.ClientSession(headers=headers) as session:
        for method, path in [("POST", "/generate"), ("GET", "/health"), ("GET", "/metrics")]:
            async with session.request(
                method, server.make_url(path), data=generate_body(2)
            ) as response:
                reply = msgspec.msgpack.decode(await response.read(), type=ErrorReply)
            assert (response.status, reply.code) == (401, "unauthorized"), path
        # the kubelet's probes need no secret and say nothing but their status
        async with session.get(server.make_url("/readyz")) as ready:
            assert (ready.status, await ready.read()) == (200, b"")
        async with session.get(server.make_url("/livez")) as live:
            assert live.status == 200
    assert backend.yielded == 0
    async with (
        aiohttp.ClientSession(headers=GATEWAY) as session,
        session.get(server.make_url("/metrics")) as metrics,
    ):
        text = await metrics.text()
    assert 'kiln_worker_requests_total{endpoint="/generate",outcome="unauthorized"} 1.0' in text
    await server.close()


async def test_an_empty_secret_refuses_every_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    worker, server = await start(tmp_path, monkeypatch, FakeGenerator())
    open_app = create_app(Worker(dataclasses.replace(worker.settings, secret=""), MANIFEST))
    runner = web.AppRunner(open_app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    async with (
        aiohttp.ClientSession(headers={"Authorization": "Bearer "}) as session,
        session.get(f"http://{host}:{port}/health") as response,
    ):
        assert response.status == 401
    await runner.cleanup()
    await server.close()


async def test_the_metrics_port_serves_metrics_alone_without_the_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    worker, server = await start(tmp_path, monkeypatch, FakeGenerator())
    runner = web.AppRunner(metrics_app(worker), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://{host}:{port}/metrics") as metrics:
            assert metrics.status == 200
            assert "kiln_worker_running_sequences" in await metrics.text()
        async with session.post(f"http://{host}:{port}/generate", data=generate_body(1)) as r:
            assert r.status == 404
    await runner.cleanup()
    await server.close()


def test_fields_left_at_their_defaults_are_not_sent() -> None:
    """So a worker older than the gateway refuses only requests that use what it lacks."""
    sent = msgspec.msgpack.decode(generate_body(3))
    assert sent == {"request_id": "gen-1", "prompt_ids": [1, 2, 3], "max_tokens": 3}


async def test_a_field_the_worker_does_not_know_is_refused_and_leased_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A newer gateway's field (a rolling upgrade) is ``unsupported``, not ignored: the
    gateway leases the request again once, then answers 503 naming the field."""
    _, server = await start(tmp_path, monkeypatch, FakeGenerator())
    newer = msgspec.msgpack.decode(generate_body(3)) | {"speculation": {"tokens": 4}}
    async with aiohttp.ClientSession(headers=GATEWAY) as session:
        for relet, refused in ((False, "unsupported"), (True, None)):
            async with session.post(
                server.make_url("/generate"), data=msgspec.msgpack.encode(newer)
            ) as response:
                assert response.status == 503
                assert await dispatch._refused(response, relet) == refused
                error = dispatch._error(await response.read())
        assert isinstance(error, ServiceUnavailable)
        assert "`speculation`" in error.message
        async with session.post(server.make_url("/generate"), data=generate_body(2)) as response:
            assert response.status == 200
            assert len(parse_frames(await response.read())) == 2
    await server.close()
