"""Shadow traffic through the official clients against one ``kiln up`` with real workers:
all-MiniLM-L6-v2 registered twice (``m`` 1 and 2, identical) and a tensor MLP uploaded three
times (``t`` 1 and 2 identical, 3 with other weights). Copies agree with an identical candidate
and not with a perturbed one, are never billed, and never change the answer's version."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import tritonclient.http as triton
from sqlalchemy import func, select

from kiln_platform.db.database import open_database
from kiln_platform.db.tables import UsageEvent
from kiln_platform.settings import Settings
from tests.fixtures.make_tensor_models import mlp

from .conftest import KilnProcess, admin_call, use_platform_admin_key
from .test_releases import _register_twice

VERSION = "x-kiln-model-version"


@pytest.fixture(scope="module")
def kiln(
    start_kiln: Callable[..., KilnProcess],
    kiln_data_dir: Callable[[], AbstractContextManager[Path]],
    minilm_dir: Path,
) -> Iterator[KilnProcess]:
    """``kiln up`` serving ``m`` 1 and 2 and ``t`` 1, 2 (same weights) and 3 (other weights),
    each worker taking one request at a time (so a copy finds its candidate busy under load)."""
    with kiln_data_dir() as path:
        asyncio.run(_register_twice(Settings(data_dir=path), minilm_dir))
        kiln = start_kiln(path, [], {"KILN_WORKER_SLOTS": "1"})  # one request a worker
        try:
            use_platform_admin_key(kiln)
            kiln.wait_until_serving("m@2")
            for version, seed in (("1", 0), ("2", 0), ("3", 1)):
                body = mlp(seed).SerializeToString()
                r = admin_call(kiln, "POST", "/models/t/versions", content=body,
                               params={"version": version})  # fmt: skip
                assert r.status_code == 201, r.text
            yield kiln
        finally:
            if kiln.proc.poll() is None:
                kiln.stop()


def _shadow(kiln: KilnProcess, model: str, version: str, percent: int = 100) -> None:
    """Set the shadow, then wait until the candidate's worker is ready (copies never start one:
    until then they are dropped as ``not_ready``)."""
    r = admin_call(kiln, "PUT", f"/models/{model}/shadow",
                   json={"version": version, "percent": percent})  # fmt: skip
    assert r.status_code == 200, r.text
    assert r.json() == {"model": model, "version": version, "percent": percent, "reports": []}
    if model == "m":
        kiln.wait_until_serving(f"m@{version}")
        return
    headers = {"authorization": f"Bearer {kiln.key}"}
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        url = f"{kiln.base_url}/v2/models/{model}/versions/{version}/ready"
        if httpx.get(url, headers=headers, timeout=5).status_code == 200:
            return
        time.sleep(0.2)
    raise TimeoutError(f"{model}@{version} not ready")


def _report(kiln: KilnProcess, model: str, candidate: str, copies: int) -> dict[str, Any]:
    """This gateway's report once every copy counted is answered (or dropped)."""
    deadline = time.monotonic() + 30
    while True:
        view = admin_call(kiln, "GET", f"/models/{model}/shadow").json()
        found: dict[str, Any] | None = next(
            (r for r in view["reports"] if r["candidate"] == candidate), None
        )
        if found is not None:
            settled = found["compared"] + found["failed"] + sum(found["dropped"].values())
            if settled >= copies or time.monotonic() > deadline:
                return found
        time.sleep(0.2)


def _billed(kiln: KilnProcess, model: str) -> dict[str, int]:
    """Requests in the ledger for ``model``, by version."""

    async def read() -> dict[str, int]:
        settings = Settings(data_dir=Path(kiln.env["KILN_DATA_DIR"]))
        async with open_database(settings) as db, db.sessions() as session:
            rows = await session.execute(
                select(UsageEvent.version, func.count())
                .where(UsageEvent.model == model)
                .group_by(UsageEvent.version)
            )
            return {version: count for version, count in rows}

    return asyncio.run(read())


def test_embeddings_copied_to_an_identical_candidate_agree(kiln: KilnProcess) -> None:
    client = openai.OpenAI(base_url=f"{kiln.base_url}/v1", api_key=kiln.key, max_retries=0)
    _shadow(kiln, "m", "1")
    before = _billed(kiln, "m")
    sent = 12
    for i in range(sent):
        raw = client.embeddings.with_raw_response.create(model="m", input=[f"hello {i}", "x"])
        assert raw.headers[VERSION] == "2"  # the primary answered; the copy went to 1
        assert len(raw.parse().data) == 2
    report = _report(kiln, "m", "1", sent)
    assert report["mirrored"] + sum(report["dropped"].values()) == sent, report
    assert report["mirrored"] >= sent // 2, report
    assert report["failed"] == 0, report
    assert report["compared"] == report["mirrored"], report
    assert report["agreement"] == 1.0, report
    assert report["cosine_min"] >= 0.9999, report
    assert report["shadow_p50_ms"] > 0
    assert report["primary_p50_ms"] > 0
    after = _billed(kiln, "m")
    assert after.get("1", 0) == before.get("1", 0)  # copies are never billed
    assert after["2"] - before.get("2", 0) == sent


def _infer(kiln: KilnProcess, x: np.ndarray) -> tuple[np.ndarray, str]:
    client = triton.InferenceServerClient(kiln.base_url.removeprefix("http://"))
    inputs = [triton.InferInput("x", list(x.shape), "FP32"),
              triton.InferInput("scale", [x.shape[0], 1], "FP32")]  # fmt: skip
    inputs[0].set_data_from_numpy(x)
    inputs[1].set_data_from_numpy(np.ones((x.shape[0], 1), np.float32))
    auth = {"authorization": f"Bearer {kiln.key}"}
    result = client.infer("t", inputs, model_version="1", headers=auth)
    version = result.get_response()["model_version"]
    return result.as_numpy("y"), str(version)


def test_tensors_agree_with_the_same_weights_and_not_with_others(kiln: KilnProcess) -> None:
    rng = np.random.default_rng(0)
    for candidate, agrees in (("2", True), ("3", False)):
        _shadow(kiln, "t", candidate)
        before = _billed(kiln, "t")
        for _ in range(6):
            y, version = _infer(kiln, rng.standard_normal((3, 16)).astype(np.float32))
            assert version == "1"
            assert y.shape == (3, 4)
        report = _report(kiln, "t", candidate, 6)
        assert report["compared"] >= 3, report
        assert report["failed"] == 0, report
        if agrees:
            assert report["agreement"] == 1.0, report
            assert report["max_abs_diff"] == 0.0, report
        else:
            assert report["agreement"] < 1.0, report
            assert report["max_abs_diff"] > 0.1, report
        after = _billed(kiln, "t")
        assert after.get(candidate, 0) == before.get(candidate, 0)
        assert after["1"] - before.get("1", 0) == 6


def test_copies_are_dropped_and_counted_under_load(kiln: KilnProcess) -> None:
    _shadow(kiln, "m", "1")
    before = _report(kiln, "m", "1", 0)
    client = openai.OpenAI(base_url=f"{kiln.base_url}/v1", api_key=kiln.key, max_retries=0)
    batch = [f"sentence {i} " * 20 for i in range(16)]
    with ThreadPoolExecutor(8) as pool:
        done = list(pool.map(lambda _: client.embeddings.create(model="m", input=batch), range(32)))
    assert len(done) == 32
    after = _report(kiln, "m", "1", 0)
    sent = after["mirrored"] - before["mirrored"]
    dropped = sum(after["dropped"].values()) - sum(before["dropped"].values())
    assert sent + dropped == 32
    grew = {r: n - before["dropped"].get(r, 0) for r, n in after["dropped"].items()}
    # 8 senders keep the primary busy: copies go only in its idle moments
    assert grew.get("primary_busy", 0) + grew.get("primary_queued", 0) > 0, after
    assert admin_call(kiln, "DELETE", "/models/m/shadow").status_code == 204
    view = admin_call(kiln, "GET", "/models/m/shadow").json()
    assert view["version"] is None
    assert view["reports"]
