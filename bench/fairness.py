"""Noisy neighbour on real workers: does tenant A's flood hurt tenant B? (see docs/benchmarks.md)

Starts its own ``kiln up`` with all-MiniLM-L6-v2 (each request embeds 8 sentences; a worker
takes ``--slots`` requests at a time, the rest wait in the gateway's fair queue), then:

1. capacity: tenant B alone, closed loop, saturating -> requests/s the pool serves;
2. B alone, open loop (Poisson) at ``--b-load`` x capacity -> B's p99 alone;
3. A at ``--a-load`` x capacity plus B as in 2, together -> B's p99 under load, B's rejections,
   how fast A's excess is turned away, served shares and Jain's index (from ``/metrics``).

Prints B's p99 under load / alone, A's rejection-latency p99, shares and the fairness index.

    python bench/fairness.py --duration 20
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import aiohttp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _corpus import sentences
from _kiln import Kiln

ITEMS = 8


@dataclass
class Outcomes:
    """Latencies by tenant and outcome."""

    ok: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    rejected: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    other: dict[str, int] = field(default_factory=lambda: defaultdict(int))


def _p(values: list[float], q: float) -> float:
    return float(np.percentile(values, q) * 1000) if values else float("nan")


async def _send(
    session: aiohttp.ClientSession, url: str, key: str, body: dict[str, object]
) -> tuple[int, float]:
    start = time.perf_counter()
    async with session.post(url, json=body, headers={"authorization": f"Bearer {key}"}) as r:
        await r.read()
        return r.status, time.perf_counter() - start


async def open_loop(
    kiln: Kiln, rates: dict[str, float], keys: dict[str, str], seconds: float, seed: int
) -> Outcomes:
    """Poisson arrivals per tenant at ``rates`` (requests/s) for ``seconds``."""
    url, out, rng = f"{kiln.base_url}/v1/embeddings", Outcomes(), random.Random(seed)
    corpus = sentences(512, seed=seed, min_words=10, max_words=30)
    tasks: set[asyncio.Task[None]] = set()

    async def one(session: aiohttp.ClientSession, tenant: str) -> None:
        body = {
            "model": kiln.model,
            "input": rng.sample(corpus, ITEMS),
            "encoding_format": "base64",
        }
        status, seconds_taken = await _send(session, url, keys[tenant], body)
        if status == 200:
            out.ok[tenant].append(seconds_taken)
        elif status in (429, 503):
            out.rejected[tenant].append(seconds_taken)
        else:
            out.other[tenant] += 1

    async def arrivals(session: aiohttp.ClientSession, tenant: str, rate: float) -> None:
        end = time.perf_counter() + seconds
        next_at = time.perf_counter()
        while (next_at := next_at + rng.expovariate(rate)) < end:
            await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
            task = asyncio.create_task(one(session, tenant))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        await asyncio.gather(*(arrivals(session, t, r) for t, r in rates.items() if r > 0))
        await asyncio.gather(*list(tasks))
    return out


async def capacity(kiln: Kiln, key: str, seconds: float) -> float:
    """Requests/s the pool serves to one saturating closed-loop tenant."""
    url, corpus, done = f"{kiln.base_url}/v1/embeddings", sentences(512, seed=7), 0
    end = time.perf_counter() + seconds

    async def client(session: aiohttp.ClientSession, i: int) -> None:
        nonlocal done
        rng = random.Random(i)
        while time.perf_counter() < end:
            body = {
                "model": kiln.model,
                "input": rng.sample(corpus, ITEMS),
                "encoding_format": "base64",
            }
            status, _ = await _send(session, url, key, body)
            done += status == 200

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(client(session, i) for i in range(16)))
    return done / seconds


async def scheduler_metrics(kiln: Kiln) -> tuple[dict[str, float], float]:
    """Service shares per tenant id and Jain's index, as the gateway exports them."""
    async with aiohttp.ClientSession() as session, session.get(f"{kiln.base_url}/metrics") as r:
        text = await r.text()
    shares, jain = {}, float("nan")
    for line in text.splitlines():
        if line.startswith("kiln_scheduler_service_share{"):
            tenant = line.split('tenant="')[1].split('"')[0]
            shares[tenant] = float(line.rsplit(" ", 1)[1])
        elif line.startswith("kiln_scheduler_fairness_index{"):
            jain = float(line.rsplit(" ", 1)[1])
    return shares, jain


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model-dir", type=Path, default=Path.home() / ".cache/kiln-test/minilm-0.1.0"
    )
    parser.add_argument("--duration", type=float, default=20.0, help="seconds per phase")
    parser.add_argument("--a-load", type=float, default=10.0, help="A's rate, x capacity")
    parser.add_argument("--b-load", type=float, default=0.2, help="B's rate, x capacity")
    parser.add_argument("--slots", type=int, default=2, help="KILN_WORKER_SLOTS")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    if not (args.model_dir / "kiln.json").exists():
        from kiln_runtimes.importers import minilm

        minilm.build(args.model_dir)

    kiln = Kiln.start(args.model_dir, {"KILN_WORKER_SLOTS": str(args.slots)})
    try:
        keys = {}
        for tenant in ("A", "B"):
            tenant_id = kiln.cli("tenants", "create", tenant).strip()
            keys[tenant] = kiln.cli("keys", "create", "--tenant", tenant).strip().splitlines()[-1]
            keys[tenant_id] = tenant
        cap = asyncio.run(capacity(kiln, keys["B"], args.duration / 2))
        alone = asyncio.run(
            open_loop(kiln, {"B": args.b_load * cap}, keys, args.duration, args.seed)
        )
        both = asyncio.run(
            open_loop(
                kiln,
                {"A": args.a_load * cap, "B": args.b_load * cap},
                keys,
                args.duration,
                args.seed + 1,
            )
        )
        shares, jain = asyncio.run(scheduler_metrics(kiln))
    finally:
        kiln.stop()

    report(alone, both, shares=shares, keys=keys, jain=jain, cap=cap)


def report(
    alone: Outcomes,
    both: Outcomes,
    *,
    shares: dict[str, float],
    keys: dict[str, str],
    jain: float,
    cap: float,
) -> None:
    """Print the noisy-neighbour figures."""
    b_alone, b_load = _p(alone.ok["B"], 99), _p(both.ok["B"], 99)
    rejected_a = both.rejected["A"]
    offered_a = len(both.ok["A"]) + len(rejected_a) + both.other["A"]
    named = {keys.get(t, t): s for t, s in shares.items()}
    onnxruntime = metadata.version("onnxruntime")
    print(f"capacity {cap:.1f} requests/s; onnxruntime {onnxruntime}")
    print(
        f"B alone   : {len(alone.ok['B'])} ok, p50 {_p(alone.ok['B'], 50):.1f} ms, "
        f"p99 {b_alone:.1f} ms"
    )
    print(
        f"B under A : {len(both.ok['B'])} ok, {len(both.rejected['B'])} rejected, "
        f"{both.other['B']} other, p50 {_p(both.ok['B'], 50):.1f} ms, p99 {b_load:.1f} ms"
    )
    print(
        f"A         : {offered_a} offered, {len(both.ok['A'])} ok, {len(rejected_a)} rejected, "
        f"{both.other['A']} other"
    )
    print(f"A rejection latency: p50 {_p(rejected_a, 50):.1f} ms, p99 {_p(rejected_a, 99):.1f} ms")
    print(f"served share (gateway window): A {named.get('A', 0):.1%}, B {named.get('B', 0):.1%}")
    print(f"Jain's fairness index (served vs weighted max-min fair share): {jain:.3f}")
    print(f"B p99 under load / alone: {b_load / b_alone:.2f}x (target <= 1.5x)")


if __name__ == "__main__":
    main()
