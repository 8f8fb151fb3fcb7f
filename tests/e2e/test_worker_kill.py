"""A worker SIGKILLed mid-batch (what the OOM killer does), with online requests in flight too.

Two MiniLM workers (the batch twin off, so lines share them); an embeddings batch runs while
four ``openai`` clients send embeddings, logging each request id and status; the worker holding
requests is SIGKILLed. The requests it held had not answered: the gateway leases each again,
once, to the other worker, so every online request answers 200; the batch completes with each
line once in its output; the ledger holds exactly one row per answered request and per line."""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import io
import json
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import psutil
import pytest
from sqlalchemy import text

from kiln_platform.db.database import open_database
from kiln_platform.settings import Settings

from .conftest import MINILM, KilnProcess, minilm_up, wait_for
from .test_drain_redispatch import TWO_WORKERS, _info, _ready_ports

LINES = 24
INPUTS = [f"text {i} " + "of a batch line on a worker about to be killed " * 10 for i in range(4)]
FINAL = {"completed", "failed", "expired", "cancelled"}


@pytest.fixture(scope="module")
def kiln(minilm_dir: Path) -> Iterator[KilnProcess]:
    # The twin off: batch lines and online requests share the two workers, so the one killed
    # holds both (with the twin on, lines would run on a third, idle-priority worker).
    env = TWO_WORKERS | {
        "KILN_BATCH_POLL_S": "0.2", "KILN_BATCH_CONCURRENCY": "2", "KILN_BATCH_TWIN": "false"
    }  # fmt: skip
    yield from minilm_up(minilm_dir, env)


def _online(kiln: KilnProcess, stop: threading.Event, log: list[tuple[str, int]]) -> None:
    """One client's loop: embeddings until ``stop``, each (request id, status) logged."""
    client = openai.OpenAI(base_url=f"{kiln.base_url}/v1", api_key=kiln.key, max_retries=0)
    i = 0
    while not stop.is_set():
        i += 1
        try:
            raw = client.embeddings.with_raw_response.create(model=MINILM, input=INPUTS[:2])
            log.append((raw.headers["x-request-id"], 200))
        except openai.APIStatusError as exc:
            log.append((exc.response.headers.get("x-request-id", ""), exc.status_code))
        except openai.APIError as exc:  # no response at all
            log.append((repr(exc), 0))


def _busy_worker(kiln: KilnProcess, ports: dict[int, str]) -> psutil.Process | None:
    """A worker with requests in flight (the one to kill)."""
    for pid, port in ports.items():
        info = _info(kiln, port)
        if info is not None and info.in_flight:
            return next(p for p in kiln.workers() if p.pid == pid)
    return None


def _ledger(kiln: KilnProcess) -> list[str]:
    async def read() -> list[str]:
        settings = Settings(data_dir=Path(kiln.env["KILN_DATA_DIR"]))
        async with open_database(settings, upgrade=False) as db, db.sessions() as session:
            return list(await session.scalars(text("SELECT request_id FROM usage_events")))

    return asyncio.run(read())


def _completed(client: openai.OpenAI, batch_id: str) -> int:
    counts = client.batches.retrieve(batch_id).request_counts
    return counts.completed if counts is not None else 0


def _finished(client: openai.OpenAI, batch_id: str) -> object:
    deadline = time.monotonic() + 60
    while (batch := client.batches.retrieve(batch_id)).status not in FINAL:
        assert time.monotonic() < deadline, f"batch still {batch.status}"
        time.sleep(0.2)
    return batch


def test_a_worker_killed_mid_batch_loses_and_double_bills_nothing(kiln: KilnProcess) -> None:
    ports: dict[int, str] = wait_for(lambda: _ready_ports(kiln))
    client = openai.OpenAI(base_url=f"{kiln.base_url}/v1", api_key=kiln.key, max_retries=0)
    before = set(_ledger(kiln))
    lines = [{"custom_id": f"r{i}", "method": "POST", "url": "/v1/embeddings",
              "body": {"model": MINILM, "input": INPUTS}} for i in range(LINES)]  # fmt: skip
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    uploaded = client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h"
    )
    stop, log = threading.Event(), list[tuple[str, int]]()
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        clients = [pool.submit(_online, kiln, stop, log) for _ in range(4)]
        wait_for(lambda: _completed(client, batch.id) >= 2, timeout=30)
        victim = wait_for(lambda: _busy_worker(kiln, ports), timeout=10)
        victim.send_signal(signal.SIGKILL)
        killed_at = len(log)
        time.sleep(4.0)  # traffic goes on while the pool restarts the worker
        stop.set()
        for done in clients:
            done.result()
    finished = _finished(client, batch.id)
    out = client.files.content(finished.output_file_id).text  # type: ignore[attr-defined]
    ids = [json.loads(line)["custom_id"] for line in out.splitlines()]
    ledger = [rid for rid in _ledger(kiln) if rid not in before]
    print(f"figures: {len(log)} online answers ({len(log) - killed_at} after the kill), "
          f"{len(ids)} batch lines, {len(ledger)} ledger rows")  # fmt: skip

    statuses = collections.Counter(status for _, status in log)
    assert statuses == {200: len(log)}, f"online requests lost to the kill: {statuses}"
    assert finished.status == "completed"  # type: ignore[attr-defined]
    assert sorted(ids) == sorted(f"r{i}" for i in range(LINES)), "a line missing or twice"
    answered = [rid for rid, _ in log]
    lines_billed = sorted(r for r in ledger if r.startswith(f"{batch.id}_"))
    assert lines_billed == sorted(f"{batch.id}_{n}" for n in range(1, LINES + 1))
    online_billed = sorted(r for r in ledger if not r.startswith(f"{batch.id}_"))
    assert online_billed == sorted(answered), "the ledger and the client's log differ"
    assert victim.pid not in {p.pid for p in kiln.workers()}
    wait_for(lambda: len(kiln.workers()) == 2, timeout=30)  # the pool restarted it
