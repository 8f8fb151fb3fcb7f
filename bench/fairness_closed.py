"""A quiet tenant beside a closed-loop flood: its p50 under the flood ÷ its p50 alone (issue 22).

Starts its own ``kiln up`` with all-MiniLM-L6-v2 (defaults otherwise: the express lane,
preemption, the express runner, the adaptive batch wait), then, ``--rounds`` times:

1. B alone: one connection, one sentence per request, back to back (a closed loop at
   concurrency 1) -> B's p50 and p99 alone;
2. the same B while tenant A runs a closed loop of ``--connections`` (48) connections of
   ``--items`` (32) sentences per request -> B's p50 and p99 under the flood, A's sentences/s.

Each tenant's client is a process of its own. Prints per round and the medians over rounds, the
ratio of B's p50s (target <= 1.5x), and the median ``Server-Timing`` parts of B's requests in
each phase (fair queue, worker queue, compute, total). ``bench/fairness.py`` is the open-loop
(Poisson) version of the same question.

    python bench/fairness_closed.py --rounds 3 --duration 15
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import multiprocessing
import random
import statistics
import sys
import time
from pathlib import Path

import aiohttp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _corpus import sentences
from _kiln import Kiln
from fairness import _send, _timings

Timings = list[tuple[float, dict[str, float]]]


async def _closed_loop(
    url: str, model: str, key: str, *, connections: int, items: int, seconds: float
) -> tuple[Timings, int]:
    """``connections`` senders back to back for ``seconds``; the served requests' latencies and
    ``Server-Timing`` parts, and how many failed."""
    corpus, out, failed = sentences(1024, seed=11, min_words=8, max_words=40), [], 0
    end = time.perf_counter() + seconds

    async def sender(session: aiohttp.ClientSession, n: int) -> None:
        nonlocal failed
        rng = random.Random(n)
        while time.perf_counter() < end:
            texts = rng.sample(corpus, items)
            body = {"model": model, "input": texts if items > 1 else texts[0]}
            status, took, timing = await _send(
                session, url, key, {**body, "encoding_format": "base64"}
            )
            if status == 200:
                out.append((took, _timings(timing)))
            else:
                failed += 1

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(sender(session, n) for n in range(connections)))
    return out, failed


def _client(
    url: str, model: str, key: str, shape: tuple[int, int], *, start_at: float, seconds: float
) -> tuple[Timings, int]:
    """One tenant's closed loop in a child process, started at the shared wall-clock time."""
    time.sleep(max(0.0, start_at - time.time()))
    connections, items = shape
    return asyncio.run(
        _closed_loop(url, model, key, connections=connections, items=items, seconds=seconds)
    )


def phase(
    kiln: Kiln, keys: dict[str, str], *, flood: tuple[int, int] | None, seconds: float
) -> dict[str, tuple[Timings, int]]:
    """B's closed loop at concurrency 1, with A's ``flood`` (connections, items) beside it."""
    url = f"{kiln.base_url}/v1/embeddings"
    clients = {"B": (1, 1)} | ({"A": flood} if flood else {})
    fork = multiprocessing.get_context("fork")
    with concurrent.futures.ProcessPoolExecutor(len(clients), mp_context=fork) as pool:
        start_at = time.time() + 1.0
        futures = {
            tenant: pool.submit(
                _client, url, kiln.model, keys[tenant], shape, start_at=start_at, seconds=seconds
            )
            for tenant, shape in clients.items()
        }
        return {tenant: future.result() for tenant, future in futures.items()}


def _ms(timings: Timings, q: float) -> float:
    return float(np.percentile([t for t, _ in timings], q) * 1000) if timings else float("nan")


def _parts(timings: Timings) -> str:
    names = ("queue", "worker-queue", "compute", "total")
    medians = {p: statistics.median(t.get(p, 0.0) for _, t in timings) for p in names}
    express = sum("express" in t for _, t in timings)
    return ", ".join(f"{k} {v:.1f}" for k, v in medians.items()) + f"; express {express}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model-dir", type=Path, default=Path.home() / ".cache/kiln-test/minilm-0.1.0"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=15.0, help="seconds per phase")
    parser.add_argument("--connections", type=int, default=48, help="A's closed-loop senders")
    parser.add_argument("--items", type=int, default=32, help="sentences per A request")
    parser.add_argument(
        "--env", action="append", default=[], metavar="KEY=VALUE", help="extra Kiln settings"
    )
    args = parser.parse_args(argv)
    if not (args.model_dir / "kiln.json").exists():
        from kiln_runtimes.importers import minilm

        minilm.build(args.model_dir)
    env = dict(pair.split("=", 1) for pair in args.env)
    kiln = Kiln.start(args.model_dir, env)
    alone_p50, flood_p50 = [], []
    try:
        keys = {}
        for tenant in ("A", "B"):
            kiln.cli("tenants", "create", tenant)
            keys[tenant] = kiln.cli("keys", "create", "--tenant", tenant).strip().splitlines()[-1]
        phase(kiln, keys, flood=None, seconds=3.0)  # warm-up
        for n in range(args.rounds):
            alone = phase(kiln, keys, flood=None, seconds=args.duration)
            both = phase(kiln, keys, flood=(args.connections, args.items), seconds=args.duration)
            b, bf, (a, a_failed) = alone["B"][0], both["B"][0], both["A"]
            alone_p50.append(_ms(b, 50))
            flood_p50.append(_ms(bf, 50))
            print(
                f"round {n + 1}: B alone p50 {_ms(b, 50):.1f} p99 {_ms(b, 99):.1f} ms "
                f"({len(b)} ok, {alone['B'][1]} failed); B under A p50 {_ms(bf, 50):.1f} "
                f"p99 {_ms(bf, 99):.1f} ms ({len(bf)} ok, {both['B'][1]} failed); "
                f"A {len(a) * args.items / args.duration:.0f} sentences/s ({a_failed} failed)"
            )
            print(f"  B alone, median ms: {_parts(b)}")
            print(f"  B under A, median ms: {_parts(bf)}")
    finally:
        kiln.stop()
    solo, loaded = statistics.median(alone_p50), statistics.median(flood_p50)
    print(
        f"B p50 alone {solo:.1f} ms, under A's closed-loop flood {loaded:.1f} ms: "
        f"{loaded / solo:.2f}x (target <= 1.5x; per round "
        + ", ".join(f"{f / s:.2f}" for s, f in zip(alone_p50, flood_p50, strict=True))
        + ")"
    )


if __name__ == "__main__":
    main()
