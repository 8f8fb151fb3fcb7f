"""A worker that starts draining while still in its pool's rotation (a scale-down's SIGTERM
racing a dispatch) refuses new requests unrun; the gateway leases each one again to another
worker instead of answering 503, and the draining worker still finishes what it runs."""

from __future__ import annotations

import concurrent.futures
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import msgspec
import pytest

from kiln_runtimes.protocol import WorkerInfo

from .conftest import MINILM, KilnProcess, minilm_up, wait_for

TWO_WORKERS = {
    "KILN_POOL_MIN_REPLICAS": "2",
    "KILN_POOL_MAX_REPLICAS": "2",
    "KILN_POOL_INITIAL_REPLICAS": "2",
    "KILN_WORKER_THREADS": "1",
}
LONG = ["a long sentence about kilns, clay and fire " * 12] * 384  # a few seconds of work


@pytest.fixture(scope="module")
def kiln(minilm_dir: Path) -> Iterator[KilnProcess]:
    yield from minilm_up(minilm_dir, TWO_WORKERS)


def _info(kiln: KilnProcess, port: str) -> WorkerInfo | None:
    try:
        r = httpx.get(f"http://127.0.0.1:{port}/health", headers=kiln.worker_headers(), timeout=2)
    except httpx.HTTPError:
        return None
    return msgspec.msgpack.decode(r.content, type=WorkerInfo)


def _ready_ports(kiln: KilnProcess) -> dict[int, str]:
    """Worker pid -> its port, once both workers are ready (else empty)."""
    found = {}
    for proc in kiln.workers():
        args = proc.cmdline()
        port = args[args.index("--port") + 1] if "--port" in args else None
        info = _info(kiln, port) if port else None
        if port and info is not None and info.ready:
            found[proc.pid] = port
    return found if len(found) == 2 else {}


def test_requests_leased_to_a_draining_worker_run_on_another(kiln: KilnProcess) -> None:
    headers = {"authorization": f"Bearer {kiln.key}"}

    def embed(inputs: list[str]) -> int:
        body = {"model": MINILM, "input": inputs}
        r = httpx.post(f"{kiln.base_url}/v1/embeddings", json=body, headers=headers, timeout=60)
        return r.status_code

    ports: dict[int, str] = wait_for(lambda: _ready_ports(kiln))
    with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
        long = pool.submit(embed, LONG)

        def busy() -> int | None:
            for pid, port in ports.items():
                info = _info(kiln, port)
                if info is not None and info.in_flight:
                    return pid
            return None

        draining = wait_for(busy, timeout=10)
        kiln_worker = next(p for p in kiln.workers() if p.pid == draining)
        kiln_worker.send_signal(signal.SIGTERM)  # drains: finishes the long request, refuses new
        wait_for(lambda: (i := _info(kiln, ports[draining])) is None or i.draining, timeout=5)
        short = list(pool.map(embed, [["hello"]] * 24))
        assert short == [200] * 24  # none got the draining worker's 503
        assert long.result() == 200  # the draining worker finished it
