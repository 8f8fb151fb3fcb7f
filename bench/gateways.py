"""Aggregate embeddings throughput through one gateway vs two sharing the same worker
(issue 21, ``KILN_SHARED_WORKERS``; see docs/benchmarks.md).

Starts an embedded PostgreSQL and two ``kiln up`` gateways on it with shared workers: the
leader runs the one all-MiniLM-L6-v2 worker, the other (started once the first serves, so it
joins a serving fleet) dispatches to it. Their data directories share one artifact store (b's
``store`` links to a's), as ``KILN_ARTIFACT_STORE=s3://...`` would make them. One load generator
(closed loops of aiohttp senders, ``embeddings._load``: one sentence per request,
``encoding_format: base64``) sends either everything to one gateway or half to each; the order
alternates between rounds.
Reports requests/s, latency and the CPU each role used (gateways, worker) per setting, medians
over rounds.

    python bench/gateways.py              # 3 rounds of 10 s per setting, ~2 minutes
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _corpus import embedding_bodies, sentences
from _kiln import cpu_seconds, free_port, register_as, stop_tree
from embeddings import _load

from kiln_platform.db.engine import embedded_server


@dataclass(frozen=True, slots=True)
class Result:
    """One measurement: through how many gateways, how fast, and whose CPU it took."""

    gateways: int
    per_s: float
    p50_ms: float
    p99_ms: float
    errors: int
    gateway_cores: float
    worker_cores: float


@dataclass
class Gateway:
    """A running ``kiln up`` of the shared fleet."""

    proc: subprocess.Popen[bytes]
    base_url: str

    def tree(self) -> list[psutil.Process]:
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(self.proc.pid)
            return [root, *root.children(recursive=True)]
        return []


def _cli(env: dict[str, str], *args: str) -> str:
    cmd = [sys.executable, "-m", "kiln_console", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120,
                          check=True).stdout  # fmt: skip


def _up(env: dict[str, str], data_dir: Path) -> Gateway:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "kiln_console", "up", "--no-import", "--port", str(port)],
        env={**env, "KILN_DATA_DIR": str(data_dir)},
    )  # fmt: skip
    return Gateway(proc, f"http://127.0.0.1:{port}")


def _serving(gateway: Gateway, model: str, key: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            r = httpx.post(f"{gateway.base_url}/v1/embeddings", timeout=5,
                           json={"model": model, "input": "warm up"},
                           headers={"authorization": f"Bearer {key}"})  # fmt: skip
            if r.status_code == 200:
                return
        if gateway.proc.poll() is not None:
            raise RuntimeError(f"kiln up exited with {gateway.proc.returncode}")
        time.sleep(0.2)
    raise TimeoutError(f"{model} not serving through {gateway.base_url} after {timeout}s")


async def _spread(
    urls: list[str], key: str, bodies: list[bytes], concurrency: int, *, warmup: float,
    duration: float,
) -> tuple[list[float], int]:  # fmt: skip
    """``concurrency`` closed-loop senders (``embeddings._load``) spread evenly over ``urls``;
    latencies in the window, and the failed requests."""
    parts = await asyncio.gather(*(
        _load(url, key, bodies, concurrency // len(urls), warmup=warmup, duration=duration)
        for url in urls
    ))  # fmt: skip
    return [x for latencies, _ in parts for x in latencies], sum(errors for _, errors in parts)


def measure(gateways: list[Gateway], key: str, bodies: list[bytes],
            args: argparse.Namespace) -> Result:  # fmt: skip
    """Load through ``gateways`` (every live gateway's and the worker's CPU counted)."""
    procs = [p for g in (gateways if len(gateways) > 1 else _ALL) for p in g.tree()]
    workers = [p for p in procs if "kiln_runtimes" in " ".join(p.cmdline())]
    front = [p for p in procs if p not in workers]
    before = (cpu_seconds(front), cpu_seconds(workers))
    urls = [f"{g.base_url}/v1/embeddings" for g in gateways]
    started = time.perf_counter()
    latencies, errors = asyncio.run(
        _spread(urls, key, bodies, args.concurrency, warmup=args.warmup, duration=args.duration)
    )
    wall = time.perf_counter() - started
    after = (cpu_seconds(front), cpu_seconds(workers))
    ms = sorted(x * 1000 for x in latencies) or [0.0]
    return Result(
        len(gateways), len(latencies) / args.duration, ms[len(ms) // 2],
        ms[min(len(ms) - 1, int(len(ms) * 0.99))], errors,
        (after[0] - before[0]) / wall, (after[1] - before[1]) / wall,
    )  # fmt: skip


_ALL: list[Gateway] = []
"""Both gateways (a one-gateway run still counts the idle one's CPU, and the worker's)."""


def _summary(results: list[Result]) -> list[dict[str, float]]:
    out = []
    for n in sorted({r.gateways for r in results}):
        mine = [r for r in results if r.gateways == n]
        row = {k: statistics.median(getattr(r, k) for r in mine) for k in asdict(mine[0])}
        out.append(row)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path,
                        default=Path.home() / ".cache" / "kiln-test" / "minilm")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    model_dir = args.model_dir
    if not (model_dir / "kiln.json").exists():  # the test cache's name carries the version
        model_dir = next(model_dir.parent.glob("minilm-*/kiln.json")).parent
    root = Path(tempfile.mkdtemp(prefix="kiln-bench-gw-"))
    with embedded_server(root / "pg") as uri:
        env = {**os.environ, "KILN_DATABASE_URL": uri, "KILN_SHARED_WORKERS": "true",
               "KILN_SECRET_KEY": secrets.token_hex(16), "KILN_LOG_LEVEL": "info",
               "KILN_WARM_STANDBY": "false"}  # fmt: skip
        model = register_as({**env, "KILN_DATA_DIR": str(root / "a")}, root / "a", model_dir)
        _cli({**env, "KILN_DATA_DIR": str(root / "a")}, "tenants", "create", "bench")
        key = _cli({**env, "KILN_DATA_DIR": str(root / "a")}, "keys", "create", "--tenant",
                   "bench").strip().splitlines()[-1]  # fmt: skip
        (root / "b").mkdir()  # one store for both, as a shared store (s3, a volume) would be
        (root / "b" / "store").symlink_to(root / "a" / "store")
        a = _up(env, root / "a")
        _serving(a, model, key)  # a leads: it started first
        b = _up(env, root / "b")
        _ALL[:] = [a, b]
        try:
            _serving(b, model, key)
            bodies = embedding_bodies(model, sentences(512))
            results = []
            for n in range(args.rounds):
                for gateways in ([a], [a, b]) if n % 2 == 0 else ([a, b], [a]):
                    results.append(measure(gateways, key, bodies, args))
                    print(json.dumps(asdict(results[-1])), flush=True)
            print(json.dumps({"medians": _summary(results), "cores": os.cpu_count()}, indent=1))
        finally:
            owned = [p for g in (a, b) for p in g.tree()]
            for gateway in (b, a):
                stop_tree(gateway.proc, owned)


if __name__ == "__main__":
    main()
