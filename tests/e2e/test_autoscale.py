"""Pools scale with their work: up under load, down after the window, to zero when idle, and
back from zero on the next request, which waits for the worker instead of getting a 503."""

from __future__ import annotations

import concurrent.futures
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from .conftest import MINILM, KilnProcess, minilm_up, wait_for

SCALING = {
    "KILN_POOL_MAX_REPLICAS": "2",
    "KILN_POOL_SCALE_DOWN_DELAY_S": "2",
    "KILN_POOL_IDLE_TO_ZERO_S": "4",
    "KILN_WORKER_SLOTS": "2",  # two requests in flight fill a worker: a small load scales up
    "KILN_WORKER_THREADS": "1",
}


@pytest.fixture(scope="module")
def kiln(minilm_dir: Path) -> Iterator[KilnProcess]:
    yield from minilm_up(minilm_dir, SCALING)


def _replicas(kiln: KilnProcess) -> dict[str, float]:
    text = httpx.get(f"{kiln.base_url}/metrics").text
    out = {}
    for line in text.splitlines():
        if line.startswith("kiln_pool_replicas{") and f'model="{MINILM}"' in line:
            state = re.search(r'state="(\w+)"', line)
            assert state is not None
            out[state.group(1)] = float(line.rsplit(" ", 1)[1])
    return out


def _embed(kiln: KilnProcess, text: str) -> int:
    sdk = openai.OpenAI(base_url=f"{kiln.base_url}/v1", api_key=kiln.key, max_retries=0)
    return len(sdk.embeddings.create(model=MINILM, input=[text] * 16).data)


def test_load_scales_the_pool_up_then_idle_scales_it_to_zero(kiln: KilnProcess) -> None:
    assert len(kiln.workers()) == 1
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        deadline = time.monotonic() + 60
        peak = 0
        while time.monotonic() < deadline and peak < 2:
            done = list(pool.map(lambda i: _embed(kiln, f"load {i}"), range(16)))
            assert done == [16] * 16
            peak = max(peak, int(_replicas(kiln).get("ready", 0)))
    assert peak == 2
    assert len(kiln.workers()) == 2
    # no requests: down to one after the window, then to zero after the idle TTL
    idle = {"desired": 0.0, "running": 0.0, "ready": 0.0, "draining": 0.0}
    wait_for(lambda: _replicas(kiln) == idle, 30)
    wait_for(lambda: not kiln.workers(), 30)  # the processes exit (SIGTERM, drained)


def test_a_request_to_a_pool_at_zero_waits_for_its_worker(kiln: KilnProcess) -> None:
    wait_for(lambda: _replicas(kiln).get("running") == 0.0, 30)
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        counts = list(pool.map(lambda i: _embed(kiln, f"cold {i}"), range(4)))
    cold = time.monotonic() - started
    assert counts == [16] * 4  # no 503: the requests waited for the cold start
    assert _replicas(kiln)["ready"] >= 1
    warm_started = time.monotonic()
    assert _embed(kiln, "warm") == 16
    assert time.monotonic() - warm_started < cold  # the next one pays no start


def _phase_totals(kiln: KilnProcess) -> dict[tuple[str, str], float]:
    """(phase, count|sum) of ``kiln_cold_start_phase_seconds`` for MiniLM."""
    text = httpx.get(f"{kiln.base_url}/metrics").text
    pattern = r"kiln_cold_start_phase_seconds_(count|sum)\{([^}]*)\} (\S+)"
    out = {}
    for kind, labels, value in re.findall(pattern, text):
        phase = re.search(r'phase="(\w+)"', labels)
        if f'model="{MINILM}"' in labels and phase is not None:
            out[phase.group(1), kind] = float(value)
    return out


def test_a_cold_start_is_observed_once_per_phase_and_they_add_up(kiln: KilnProcess) -> None:
    phases = ("scheduling", "process_start", "model_load", "warmup", "first_response")
    sdk = openai.OpenAI(base_url=f"{kiln.base_url}/v1", api_key=kiln.key, max_retries=0)
    # the client's own first-call costs (its connection, importing numpy to decode base64) are
    # paid now, while the pool is warm: the timed wait is the server's
    assert len(sdk.embeddings.create(model=MINILM, input="warm client").data) == 1
    wait_for(lambda: _replicas(kiln).get("running") == 0.0, 30)
    before = _phase_totals(kiln)
    started = time.perf_counter()  # the request alone: not the client's construction
    assert len(sdk.embeddings.create(model=MINILM, input="cold phases").data) == 1
    waited = time.perf_counter() - started
    done = before.get(("first_response", "count"), 0.0) + 1  # observed once the response is sent
    after = wait_for(
        lambda: (t := _phase_totals(kiln)).get(("first_response", "count")) == done and t, 10
    )
    delta = {k: after[k] - before.get(k, 0.0) for k in after}
    assert {p: delta[p, "count"] for p in phases} == dict.fromkeys(phases, 1.0)
    assert all(delta[p, "sum"] > 0 for p in ("process_start", "model_load", "first_response"))
    total = sum(delta[p, "sum"] for p in phases)
    assert abs(total - waited) <= 0.05 * waited, (total, waited, delta)
