"""A tensor worker as a real subprocess: engine compiled on first start, cache hit on the second."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import msgspec
import numpy as np
import onnxruntime as ort
import pytest

from kiln_runtimes.protocol import (
    CONTENT_TYPE,
    MANIFEST_NAME,
    WORKER_SECRET_ENV,
    InferRequest,
    InferResult,
    ModelManifest,
    Tensor,
)
from kiln_runtimes.store import ArtifactStore


@pytest.fixture(scope="module")
def stored(
    tensor_models: dict[str, Path],
    mlp_manifest: ModelManifest,
    tmp_path_factory: pytest.TempPathFactory,
) -> Path:
    """The MLP as a store tree (where the pool manager points workers)."""
    folder = tmp_path_factory.mktemp("mlp")
    (folder / "model.onnx").write_bytes(tensor_models["mlp"].read_bytes())
    (folder / MANIFEST_NAME).write_bytes(msgspec.json.encode(mlp_manifest))
    store = ArtifactStore(tmp_path_factory.mktemp("store"))
    return store.path(store.put_dir(folder))


SECRET = "tensor-worker-test-secret"
GATEWAY = {"Authorization": f"Bearer {SECRET}"}


def start(model_dir: Path, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [sys.executable, "-m", "kiln_runtimes", "--model-dir", str(model_dir),
               "--port", str(port), "--threads", "1", "--max-batch-size", "8"]  # fmt: skip
    env = {**os.environ, WORKER_SECRET_ENV: SECRET}
    proc = subprocess.Popen(command, stderr=log.open("wb"), stdout=subprocess.DEVNULL, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()
        try:
            if httpx.get(f"{url}/health", headers=GATEWAY, timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    proc.kill()
    raise AssertionError(log.read_text())


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0


def metric(url: str, name: str) -> dict[str, float]:
    lines = httpx.get(f"{url}/metrics", headers=GATEWAY).text.splitlines()
    return {
        line.split(" ")[0]: float(line.split(" ")[1]) for line in lines if line.startswith(name)
    }


def events(log: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]


def test_second_start_loads_the_cached_engine(
    stored: Path, tensor_models: dict[str, Path], tmp_path: Path
) -> None:
    proc, url = start(stored, tmp_path / "first.log")
    try:
        assert metric(url, "kiln_worker_engine_cache_total") == {
            'kiln_worker_engine_cache_total{result="miss"}': 1.0
        }
        x = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)
        scale = np.full((3, 1), 2.0, np.float32)
        request = InferRequest(
            request_id="r",
            inputs=[Tensor(name="x", datatype="FP32", shape=[3, 16], data=x.tobytes()),
                    Tensor(name="scale", datatype="FP32", shape=[3, 1], data=scale.tobytes())],
        )  # fmt: skip
        reply = httpx.post(
            f"{url}/infer", content=msgspec.msgpack.encode(request),
            headers={"content-type": CONTENT_TYPE, **GATEWAY},
        )  # fmt: skip
        result = msgspec.msgpack.decode(reply.content, type=InferResult)
        session = ort.InferenceSession(str(tensor_models["mlp"]))
        expected = session.run(["y", "norm"], {"x": x, "scale": scale})
        for got, want in zip(result.outputs, expected, strict=True):
            array = np.frombuffer(got.data, np.float32).reshape(got.shape)
            assert float(np.max(np.abs(array - want))) <= 1e-5
    finally:
        stop(proc)
    assert any(e["event"] == "engine cache miss" for e in events(tmp_path / "first.log"))

    proc, url = start(stored, tmp_path / "second.log")
    try:
        assert metric(url, "kiln_worker_engine_cache_total") == {
            'kiln_worker_engine_cache_total{result="hit"}': 1.0
        }
        assert metric(url, "kiln_worker_load_seconds")["kiln_worker_load_seconds"] > 0
    finally:
        stop(proc)
    hit = [e for e in events(tmp_path / "second.log") if e["event"] == "engine cache hit"]
    assert hit
    assert hit[0]["precision"] == "fp32"


def test_a_plain_folder_serves_without_an_engine_cache(
    tensor_models: dict[str, Path], mlp_manifest: ModelManifest, tmp_path: Path
) -> None:
    folder = tmp_path / "plain"
    folder.mkdir()
    (folder / "model.onnx").write_bytes(tensor_models["mlp"].read_bytes())
    (folder / MANIFEST_NAME).write_bytes(msgspec.json.encode(mlp_manifest))
    proc, url = start(folder, tmp_path / "plain.log")
    try:
        assert metric(url, "kiln_worker_engine_cache_total") == {
            'kiln_worker_engine_cache_total{result="uncached"}': 1.0
        }
    finally:
        stop(proc)
