"""The worker as a real subprocess serving a tiny ONNX embeddings model over msgpack HTTP."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import numpy as np
import numpy.typing as npt
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from kiln_runtimes.protocol import (
    CONTENT_TYPE,
    MANIFEST_NAME,
    WORKER_SECRET_ENV,
    EmbedRequest,
    EmbedResult,
    ErrorReply,
    ModelManifest,
    WorkerInfo,
)

VOCAB, DIMENSIONS, CONTEXT, MAX_QUEUE = 50, 8, 16, 256
Table = npt.NDArray[np.float32]


def build_model(path: Path, table: Table) -> None:
    """Gather rows of ``table``, mean them over ``attention_mask``, L2-normalize."""
    axis_1 = numpy_helper.from_array(np.array([1], dtype=np.int64), "axis_1")
    axis_last = numpy_helper.from_array(np.array([-1], dtype=np.int64), "axis_last")
    nodes = [
        helper.make_node("Gather", ["table", "input_ids"], ["tokens"], axis=0),
        helper.make_node("Cast", ["attention_mask"], ["mask"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["mask", "axis_last"], ["mask3"]),
        helper.make_node("Mul", ["tokens", "mask3"], ["masked"]),
        helper.make_node("ReduceSum", ["masked", "axis_1"], ["summed"], keepdims=0),
        helper.make_node("ReduceSum", ["mask3", "axis_1"], ["count"], keepdims=0),
        helper.make_node("Div", ["summed", "count"], ["mean"]),
        helper.make_node("Mul", ["mean", "mean"], ["squares"]),
        helper.make_node("ReduceSum", ["squares", "axis_last"], ["sum_squares"], keepdims=1),
        helper.make_node("Sqrt", ["sum_squares"], ["norm"]),
        helper.make_node("Div", ["mean", "norm"], ["embeddings"]),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny-embed",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"]),
        ],
        [helper.make_tensor_value_info("embeddings", TensorProto.FLOAT, ["batch", DIMENSIONS])],
        [numpy_helper.from_array(table, "table"), axis_1, axis_last],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, path)


def reference(table: Table, sequence: list[int]) -> Table:
    """What the model computes for one unpadded sequence."""
    mean: Table = table[sequence].mean(axis=0)
    return mean / np.linalg.norm(mean)


@dataclass
class RunningWorker:
    """A worker subprocess and what a test needs to talk to it."""

    process: subprocess.Popen[bytes]
    url: str
    table: Table
    log: Path

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Table]:
    folder = tmp_path_factory.mktemp("tiny-embed")
    table = np.random.default_rng(7).standard_normal((VOCAB, DIMENSIONS)).astype(np.float32)
    build_model(folder / "model.onnx", table)
    manifest = ModelManifest(
        name="tiny-embed",
        task="embeddings",
        engine="onnxruntime",
        context_length=CONTEXT,
        dimensions=DIMENSIONS,
        tokenizer_file=None,
    )
    (folder / MANIFEST_NAME).write_bytes(msgspec.json.encode(manifest))
    return folder, table


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


SECRET = "worker-process-test-secret"
GATEWAY = {"Authorization": f"Bearer {SECRET}"}
"""What the gateway's calls carry (``pools.backend.worker_headers``)."""


def start_worker(
    model: tuple[Path, Table], log: Path, *extra: str, secret: str | None = SECRET
) -> RunningWorker:
    folder, table = model
    port = free_port()
    command = [sys.executable, "-m", "kiln_runtimes", "--model-dir", str(folder)]
    command += ["--model", "tiny", "--version", "3", "--port", str(port), "--threads", "1"]
    env = {k: v for k, v in os.environ.items() if k != WORKER_SECRET_ENV}
    if secret is not None:
        env[WORKER_SECRET_ENV] = secret
    process = subprocess.Popen(
        [*command, *extra], stderr=log.open("wb"), stdout=subprocess.DEVNULL, env=env
    )
    return RunningWorker(process, f"http://127.0.0.1:{port}", table, log)


async def wait_ready(session: aiohttp.ClientSession, worker: RunningWorker) -> WorkerInfo:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert worker.process.poll() is None, worker.log.read_text()
        try:
            async with session.get(f"{worker.url}/health") as response:
                info = msgspec.msgpack.decode(await response.read(), type=WorkerInfo)
                assert response.status == (200 if info.ready else 503)
                if info.ready:
                    return info
        except aiohttp.ClientConnectionError:
            pass
        await asyncio.sleep(0.05)
    raise AssertionError(f"worker never became ready:\n{worker.log.read_text()}")


async def post_embed(
    session: aiohttp.ClientSession, url: str, request: EmbedRequest
) -> tuple[int, EmbedResult | ErrorReply]:
    body = msgspec.msgpack.encode(request)
    headers = {"Content-Type": CONTENT_TYPE}
    async with session.post(f"{url}/embed", data=body, headers=headers) as response:
        payload = await response.read()
        assert response.headers["Content-Type"].startswith(CONTENT_TYPE)
        kind: type[EmbedResult | ErrorReply] = EmbedResult if response.status == 200 else ErrorReply
        return response.status, msgspec.msgpack.decode(payload, type=kind)


def log_lines(path: Path) -> list[dict[str, Any]]:
    """The worker's JSON log lines."""
    return [msgspec.json.decode(line) for line in path.read_bytes().splitlines()]


def rows(result: EmbedResult, count: int) -> Table:
    return np.frombuffer(result.data, dtype="<f4").reshape(count, result.dimensions)


@pytest.fixture(scope="module")
def worker(
    model_dir: tuple[Path, Table], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningWorker]:
    log = tmp_path_factory.mktemp("logs") / "worker.log"
    running = start_worker(model_dir, log, "--max-batch-size", "8", "--max-queue", str(MAX_QUEUE))
    yield running
    running.stop()


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(headers=GATEWAY) as client:
        yield client


async def test_health_reports_the_served_model(
    worker: RunningWorker, session: aiohttp.ClientSession
) -> None:
    info = await wait_ready(session, worker)
    assert (info.model, info.version, info.task) == ("tiny", "3", "embeddings")
    assert (info.ready, info.draining, info.max_batch_size, info.free_slots) == (
        True,
        False,
        8,
        MAX_QUEUE,
    )


async def test_embeddings_match_numpy(
    worker: RunningWorker, session: aiohttp.ClientSession
) -> None:
    await wait_ready(session, worker)
    rng = np.random.default_rng(1)
    requests = [
        EmbedRequest(
            request_id=f"req-{n}",
            input_ids=[
                rng.integers(0, VOCAB, int(rng.integers(1, CONTEXT + 1))).tolist()
                for _ in range(int(rng.integers(1, 12)))
            ],
            timeout_ms=10_000,
        )
        for n in range(24)
    ]
    answers = await asyncio.gather(*(post_embed(session, worker.url, r) for r in requests))
    for request, (status, result) in zip(requests, answers, strict=True):
        assert status == 200, result
        assert isinstance(result, EmbedResult)
        assert result.request_id == request.request_id
        assert result.dimensions == DIMENSIONS
        assert result.queue_ms >= 0
        assert result.compute_ms >= 0
        expected = np.stack([reference(worker.table, ids) for ids in request.input_ids])
        np.testing.assert_allclose(rows(result, len(request.input_ids)), expected, atol=1e-5)


@pytest.mark.parametrize(
    ("input_ids", "reason"),
    [
        ([], "input_ids is empty"),
        ([[1, 2], []], "input 1 is empty"),
        ([[1] * (CONTEXT + 1)], "context"),
        ([[3, -1]], "token id"),
        ([[1]] * (MAX_QUEUE + 1), "queue"),
    ],
)
async def test_bad_requests_get_400_and_the_worker_keeps_serving(
    worker: RunningWorker,
    session: aiohttp.ClientSession,
    input_ids: list[list[int]],
    reason: str,
) -> None:
    await wait_ready(session, worker)
    request = EmbedRequest(request_id="bad", input_ids=input_ids)
    status, reply = await post_embed(session, worker.url, request)
    assert status == 400
    assert isinstance(reply, ErrorReply)
    assert reply.code == "bad_request"
    assert reason in reply.message
    status, result = await post_embed(
        session, worker.url, EmbedRequest(request_id="ok", input_ids=[[5]])
    )
    assert status == 200
    assert isinstance(result, EmbedResult)
    np.testing.assert_allclose(rows(result, 1)[0], reference(worker.table, [5]), atol=1e-5)


async def test_undecodable_body_is_a_bad_request(
    worker: RunningWorker, session: aiohttp.ClientSession
) -> None:
    await wait_ready(session, worker)
    async with session.post(f"{worker.url}/embed", data=b"\xc1 not msgpack") as response:
        assert response.status == 400
        reply = msgspec.msgpack.decode(await response.read(), type=ErrorReply)
    assert reply.code == "bad_request"


async def test_hopeless_deadline_gets_504(
    worker: RunningWorker, session: aiohttp.ClientSession
) -> None:
    await wait_ready(session, worker)
    request = EmbedRequest(request_id="late", input_ids=[[1, 2]], timeout_ms=0)
    status, reply = await post_embed(session, worker.url, request)
    assert status == 504
    assert isinstance(reply, ErrorReply)
    assert reply.code == "deadline_exceeded"


async def test_metrics_count_requests_and_batches(
    worker: RunningWorker, session: aiohttp.ClientSession
) -> None:
    await wait_ready(session, worker)
    await post_embed(session, worker.url, EmbedRequest(request_id="m", input_ids=[[1], [2, 3]]))
    async with session.get(f"{worker.url}/metrics") as response:
        assert response.status == 200
        text = await response.text()
    assert 'kiln_worker_requests_total{endpoint="/embed",outcome="ok"}' in text
    assert 'kiln_worker_requests_total{endpoint="/embed",outcome="bad_request"}' in text
    assert "kiln_worker_batch_size_bucket" in text
    assert "kiln_worker_queue_wait_seconds_count" in text
    assert "kiln_worker_compute_seconds_count" in text
    assert "kiln_worker_ready 1.0" in text
    assert "kiln_worker_queued 0.0" in text


async def test_request_ids_are_in_the_log_lines(
    worker: RunningWorker, session: aiohttp.ClientSession
) -> None:
    await wait_ready(session, worker)
    await post_embed(session, worker.url, EmbedRequest(request_id="trace-me", input_ids=[]))
    await asyncio.sleep(0.1)
    lines = log_lines(worker.log)
    refused = [line for line in lines if line.get("event") == "request refused"]
    assert any(line.get("request_id") == "trace-me" for line in refused)


async def test_worker_that_cannot_load_exits_1(
    model_dir: tuple[Path, Table], tmp_path: Path
) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    manifest = ModelManifest(name="broken", task="embeddings", engine="onnxruntime")
    (broken / MANIFEST_NAME).write_bytes(msgspec.json.encode(manifest))
    worker = start_worker((broken, model_dir[1]), tmp_path / "broken.log")
    try:
        assert await asyncio.to_thread(worker.process.wait, 30) == 1
    finally:
        worker.stop()
    failures = [line for line in log_lines(worker.log) if line["event"] == "model failed to load"]
    assert len(failures) == 1
    assert "model.onnx" in str(failures[0]["exception"])


async def test_sigterm_drains_in_flight_requests_then_exits_0(
    model_dir: tuple[Path, Table], tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    # A long fixed wait keeps the requests queued while the signal arrives.
    drained = start_worker(
        model_dir, tmp_path / "drain.log", "--max-wait-ms", "400", "--fixed-wait"
    )
    try:
        await wait_ready(session, drained)
        requests = [
            EmbedRequest(request_id=f"drain-{n}", input_ids=[[n % VOCAB, 1], [2]])
            for n in range(10)
        ]
        in_flight = [asyncio.create_task(post_embed(session, drained.url, r)) for r in requests]
        await asyncio.sleep(0.15)
        assert not any(task.done() for task in in_flight)
        os.kill(drained.process.pid, signal.SIGTERM)
        await asyncio.sleep(0.05)
        async with session.get(f"{drained.url}/health") as response:
            info = msgspec.msgpack.decode(await response.read(), type=WorkerInfo)
            assert response.status == 503
            assert info.draining
            assert not info.ready
            assert info.in_flight == len(requests)
        status, reply = await post_embed(
            session, drained.url, EmbedRequest(request_id="too-late", input_ids=[[1]])
        )
        assert status == 503
        assert isinstance(reply, ErrorReply)
        assert reply.code == "draining"
        for request, (status, result) in zip(
            requests, await asyncio.gather(*in_flight), strict=True
        ):
            assert status == 200
            assert isinstance(result, EmbedResult)
            expected = [reference(drained.table, ids) for ids in request.input_ids]
            np.testing.assert_allclose(rows(result, 2), expected, atol=1e-5)
        assert await asyncio.to_thread(drained.process.wait, 15) == 0
        lines = log_lines(drained.log)
        events = [line["event"] for line in lines]
        assert events.index("draining") < events.index("stopped")
        refused = [line for line in lines if line["event"] == "request refused"]
        assert [(line["request_id"], line["code"]) for line in refused] == [
            ("too-late", "draining")
        ]
    finally:
        drained.stop()


async def test_a_worker_without_its_secret_does_not_start(
    model_dir: tuple[Path, Table], tmp_path: Path
) -> None:
    worker = start_worker(model_dir, tmp_path / "nosecret.log", secret=None)
    try:
        assert await asyncio.to_thread(worker.process.wait, 30) != 0
    finally:
        worker.stop()
    assert WORKER_SECRET_ENV in worker.log.read_text()


async def test_only_the_metrics_port_answers_without_the_secret(
    model_dir: tuple[Path, Table], tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    metrics_port = free_port()
    worker = start_worker(model_dir, tmp_path / "m.log", "--metrics-port", str(metrics_port))
    try:
        await wait_ready(session, worker)
        async with aiohttp.ClientSession() as anonymous:
            for path in ("/health", "/metrics"):
                async with anonymous.get(f"{worker.url}{path}") as refused:
                    assert refused.status == 401
            status, _ = await post_embed(
                anonymous, worker.url, EmbedRequest(request_id="x", input_ids=[[1]])
            )
            assert status == 401
            async with anonymous.get(f"http://127.0.0.1:{metrics_port}/metrics") as scraped:
                assert scraped.status == 200
                assert 'outcome="unauthorized"} 1.0' in await scraped.text()
            async with anonymous.get(f"{worker.url}/readyz") as ready:
                assert ready.status == 200
    finally:
        worker.stop()
