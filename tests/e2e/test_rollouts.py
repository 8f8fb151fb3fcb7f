"""Automatic canary analysis end to end: ``kiln up``, a tensor model whose canary version
fails in ONNX Runtime for 5 % of inputs (a Gather whose index leaves its table when the first
input value crosses a threshold), driven through OIP ``/v2`` with httpx. The rollout splits by
request; it is rolled back on its own with no more failed requests than its plan allows, and a
healthy canary is promoted through every step to stable. Decisions are in the rollout history
and the audit log with their figures, and a loopback receiver gets the rollback event once."""

from __future__ import annotations

import http.server
import json
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from .conftest import KilnProcess, admin_call, use_platform_admin_key, wait_for

MODEL, THRESHOLD, CROSS, CONCURRENCY = "cm", 10.0, 20.0, 4
"""Version 2 fails for a first input value over 10 (the workers' warmup feeds standard normal
values: never that high); the clients send 20 for 5 % of requests."""


def _graph(threshold: float) -> bytes:
    """``y = x W + table[index]``: the index is 0, or 1000 (out of the 4-entry table: ONNX
    Runtime fails the run) when ``x[:, 0] > threshold``."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((16, 4)).astype(np.float32), "w"),
        numpy_helper.from_array(np.zeros(4, np.float32), "table"),
        numpy_helper.from_array(np.array([threshold], np.float32), "threshold"),
        numpy_helper.from_array(np.array([1000], np.int64), "far"),
        *(numpy_helper.from_array(np.array([v], np.int64), n)
          for n, v in (("zero", 0), ("one", 1))),
    ]  # fmt: skip
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["xw"]),
        helper.make_node("Slice", ["x", "zero", "one", "one"], ["first"]),
        helper.make_node("Greater", ["first", "threshold"], ["over"]),
        helper.make_node("Cast", ["over"], ["flag"], to=TensorProto.INT64),
        helper.make_node("Mul", ["flag", "far"], ["index"]),
        helper.make_node("Gather", ["table", "index"], ["offset"], axis=0),
        helper.make_node("Add", ["xw", "offset"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "canary",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])], inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    body: bytes = model.SerializeToString()
    return body


class Receiver(http.server.BaseHTTPRequestHandler):
    """A loopback alert webhook: keeps every notification's body."""

    seen: list[dict[str, Any]] = []  # noqa: RUF012 (shared with the test)

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["content-length"]))
        Receiver.seen.append(json.loads(body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture(scope="module")
def kiln(
    start_kiln: Callable[..., KilnProcess],
    kiln_data_dir: Callable[[], AbstractContextManager[Path]],
) -> Iterator[KilnProcess]:
    """``kiln up``: versions 1 (healthy) and 2 (fails for 5 % of inputs), both warm, stable 1,
    and an alert receiver on loopback."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    with kiln_data_dir() as path:
        kiln = start_kiln(path, [], {"KILN_ROLLOUT_INTERVAL_S": "0.2"})
        try:
            use_platform_admin_key(kiln)
            for version, threshold in (("1", 1e9), ("2", THRESHOLD)):
                _upload(kiln, version, threshold)
            r = admin_call(kiln, "PUT", f"/models/{MODEL}/route", json={"stable_version": "1"})
            assert r.is_success, r.text
            url = f"http://127.0.0.1:{server.server_address[1]}/hook"
            r = admin_call(kiln, "POST", "/alert-receivers", json={"name": "hook", "url": url})
            assert r.status_code == 201, r.text
            for address in (MODEL, f"{MODEL}@2"):  # both warm
                wait_for(partial(_answers, kiln, address), 120)
            yield kiln
        finally:
            server.shutdown()
            if kiln.proc.poll() is None:
                kiln.stop()


def _upload(kiln: KilnProcess, version: str, threshold: float) -> None:
    r = admin_call(kiln, "POST", f"/models/{MODEL}/versions", content=_graph(threshold),
                   params={"version": version})  # fmt: skip
    assert r.status_code == 201, r.text


def _infer(kiln: KilnProcess, model: str, first: float) -> tuple[int, str]:
    """One OIP inference whose first input value is ``first``: (status, version answered)."""
    data = [first, *np.random.default_rng().random(15).tolist()]
    body = {"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32", "data": data}]}
    r = httpx.post(f"{kiln.base_url}/v2/models/{model}/infer", json=body, timeout=30,
                   headers={"authorization": f"Bearer {kiln.key}"})  # fmt: skip
    return r.status_code, r.headers.get("x-kiln-model-version", "")


def _answers(kiln: KilnProcess, model: str) -> bool:
    return _infer(kiln, model, 0.1)[0] == 200


def _drive(kiln: KilnProcess, until: Callable[[], bool], most: int) -> Counter[tuple[int, str]]:
    """Send requests (5 % of them crossing the threshold) from ``CONCURRENCY`` threads until
    ``until()`` holds or ``most`` were sent; count (status, version)."""
    rng, lock, seen = random.Random(19), threading.Lock(), Counter[tuple[int, str]]()
    stop = threading.Event()

    def client() -> None:
        while not stop.is_set():
            with lock:
                if sum(seen.values()) >= most:
                    return
                first = CROSS if rng.random() < 0.05 else rng.random()
            outcome = _infer(kiln, MODEL, first)
            with lock:
                seen[outcome] += 1

    with ThreadPoolExecutor(CONCURRENCY) as pool:
        for _ in range(CONCURRENCY):
            pool.submit(client)
        while not until() and sum(seen.values()) < most:
            time.sleep(0.05)
        stop.set()
    return seen


def _rollout(kiln: KilnProcess) -> dict[str, Any]:
    r = admin_call(kiln, "GET", f"/models/{MODEL}/rollout")
    assert r.status_code == 200, r.text
    found: dict[str, Any] = r.json()
    return found


def _decisions(kiln: KilnProcess) -> list[dict[str, Any]]:
    r = admin_call(kiln, "GET", "/audit", params={"action": "model.rollout.decision"})
    return [row["after"] for row in r.json()["data"]]


def test_a_canary_failing_5_percent_is_rolled_back_within_its_bound(kiln: KilnProcess) -> None:
    plan = {"steps": [50, 100], "split": "request", "min_requests": 5000, "min_seconds": 600}
    r = admin_call(kiln, "PUT", f"/models/{MODEL}/rollout",
                   json={"canary_version": "2", "plan": plan})  # fmt: skip
    assert r.status_code == 200, r.text
    bound = r.json()["failure_bound"]
    assert bound == 11  # ceil(ln 20 / ln(4/3)) at 50 %: docs/architecture.md
    seen = _drive(kiln, lambda: _rollout(kiln)["state"] != "running", most=4000)
    rollout = _rollout(kiln)
    assert rollout["state"] == "rolled_back"
    failed = sum(n for (status, _), n in seen.items() if status >= 500)
    assert 0 < failed <= bound + CONCURRENCY, seen  # the in-flight ones may still fail
    assert {v for (status, v), n in seen.items() if status == 200} <= {"1", "2"}
    last = rollout["history"][-1]
    assert (last["action"], last["step"]) == ("rollback", 50)
    figures = last["figures"]
    assert figures["canary"]["errors"] >= bound
    assert figures["stable"]["errors"] == 0
    assert figures["llr"] >= figures["threshold"]
    assert _decisions(kiln)[0]["figures"] == figures  # the audit log has the same figures
    assert {_infer(kiln, MODEL, CROSS)[1] for _ in range(10)} == {"1"}  # all on stable again
    wait_for(lambda: _events("KilnCanaryRolledBack"), 30)
    time.sleep(1.0)
    (event,) = _events("KilnCanaryRolledBack")  # once
    assert event["status"] == "firing"
    assert event["commonLabels"]["canary_version"] == "2"
    assert json.loads(event["commonAnnotations"]["figures"]) == figures


def test_a_healthy_canary_is_promoted_through_every_step(kiln: KilnProcess) -> None:
    """Version 3 is new: no worker of it runs when its rollout starts. The split serves stable
    until the canary's worker is ready, so its start is neither a wait nor a p99 latency held
    against it (the plan allows 5x the stable's)."""
    _upload(kiln, "3", 1e9)
    plan = {"steps": [20, 50, 100], "split": "request", "min_requests": 60, "min_seconds": 0.5,
            "max_latency_ratio": 5.0}  # fmt: skip
    r = admin_call(kiln, "PUT", f"/models/{MODEL}/rollout",
                   json={"canary_version": "3", "plan": plan})  # fmt: skip
    assert r.status_code == 200, r.text
    _drive(kiln, lambda: _rollout(kiln)["state"] != "running", most=3000)
    rollout = _rollout(kiln)
    assert rollout["state"] == "completed", rollout["history"][-1]
    steps = [(h["action"], h["step"]) for h in rollout["history"]]
    assert steps == [("start", 0), ("promote", 20), ("complete", 50)]
    for h in rollout["history"][1:]:
        assert h["figures"]["canary"]["requests"] >= 60
        assert h["figures"]["canary"]["errors"] == 0
    assert json.loads(kiln.cli("models", "rollout", MODEL))["history"] == rollout["history"]
    route = admin_call(kiln, "GET", f"/models/{MODEL}/route").json()
    assert (route["stable_version"], route["canary_version"]) == ("3", None)
    assert {_infer(kiln, MODEL, 0.5)[1] for _ in range(10)} == {"3"}
    assert [d["action"] for d in _decisions(kiln)[:2]] == ["complete", "promote"]
    wait_for(lambda: len(_events("KilnCanaryRollout")) == 2, 30)
    assert {e["commonLabels"]["severity"] for e in _events("KilnCanaryRollout")} == {"info"}


def _events(name: str) -> list[dict[str, Any]]:
    return [n for n in Receiver.seen if n["commonLabels"]["alertname"] == name]
