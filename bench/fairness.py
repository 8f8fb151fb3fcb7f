"""Noisy neighbour on real workers: does tenant A's flood hurt tenant B? (see docs/benchmarks.md)

Starts its own ``kiln up`` with all-MiniLM-L6-v2 (each request embeds 8 sentences; a worker
takes ``--slots`` requests at a time, the rest wait in the gateway's fair queue), then:

1. capacity: tenant B alone, closed loop, saturating -> requests/s the pool serves;
2. B alone, open loop (Poisson) at ``--b-load`` x capacity -> B's p99 alone;
3. A at ``--a-load`` x capacity plus B as in 2, together -> B's p99 under load, B's rejections,
   how fast A's excess is turned away, served shares and Jain's index (from ``/metrics``).

Prints B's p99 under load / alone, A's rejection-latency p99, shares and the fairness index;
then the cores each role used in each phase, and where B's slowest 5% spent their time (from the
gateway's ``Server-Timing``: fair queue, worker queue, compute, and how many took the express
lane).

Each tenant's load generator runs in a process of its own, so B's timing never waits behind
A's flood in one event loop. ``--client-nice N`` lowers the generators' CPU priority (real
clients run elsewhere, here they share the two cores with Kiln); it is off by default because a
niced generator is starved whenever the cores are busy, and its timings then include that wait
(docs/benchmarks.md). A's achieved rate is printed beside its target, so a starved generator
shows.

    python bench/fairness.py --duration 20
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import math
import multiprocessing
import os
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
from _kiln import Kiln, cpu_seconds

ITEMS = 8
SHARD_RATE = 150.0
"""Requests/s one load-generator process sends at most."""


@dataclass
class Outcomes:
    """Latencies by tenant and outcome."""

    ok: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    rejected: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    other: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    timings: dict[str, list[tuple[float, dict[str, float]]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    """Each served request's latency and its ``Server-Timing`` parts."""
    cpu: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    """Cores used during the phase, by role (gateway, worker, postgres, generators)."""


def _p(values: list[float], q: float) -> float:
    return float(np.percentile(values, q) * 1000) if values else float("nan")


async def _send(
    session: aiohttp.ClientSession, url: str, key: str, body: dict[str, object]
) -> tuple[int, float, str]:
    start = time.perf_counter()
    async with session.post(url, json=body, headers={"authorization": f"Bearer {key}"}) as r:
        await r.read()
        return r.status, time.perf_counter() - start, r.headers.get("server-timing", "")


def _timings(header: str) -> dict[str, float]:
    """``Server-Timing`` as {name: ms} (``express`` present when the request had the lane)."""
    out = {}
    for part in filter(None, (p.strip() for p in header.split(","))):
        name, _, dur = part.partition(";dur=")
        out[name] = float(dur or 0)
    return out


async def open_loop(
    kiln: Kiln, rates: dict[str, float], keys: dict[str, str], seconds: float, seed: int
) -> Outcomes:
    """Poisson arrivals per tenant at ``rates`` (requests/s) for ``seconds``."""
    return await _open_loop(kiln.base_url, kiln.model, rates, keys, seconds=seconds, seed=seed)


async def _open_loop(
    base_url: str,
    model: str,
    rates: dict[str, float],
    keys: dict[str, str],
    *,
    seconds: float,
    seed: int,
) -> Outcomes:
    url, out, rng = f"{base_url}/v1/embeddings", Outcomes(), random.Random(seed)
    corpus = sentences(512, seed=seed, min_words=10, max_words=30)
    tasks: set[asyncio.Task[None]] = set()

    async def one(session: aiohttp.ClientSession, tenant: str) -> None:
        body = {"model": model, "input": rng.sample(corpus, ITEMS), "encoding_format": "base64"}
        status, seconds_taken, timing = await _send(session, url, keys[tenant], body)
        if status == 200:
            out.ok[tenant].append(seconds_taken)
            out.timings[tenant].append((seconds_taken, _timings(timing)))
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


def _tenant_process(
    base_url: str,
    model: str,
    tenant: str,
    rate: float,
    *,
    keys: dict[str, str],
    timing: tuple[float, float, int, int],
) -> tuple[list[float], list[float], int, float, list[tuple[float, dict[str, float]]]]:
    """One tenant's open loop in a child process, started at the shared wall-clock time;
    returns its outcomes and the CPU seconds it used."""
    start_at, seconds, seed, nice = timing
    os.nice(nice)
    time.sleep(max(0.0, start_at - time.time()))
    out = asyncio.run(_open_loop(base_url, model, {tenant: rate}, keys, seconds=seconds, seed=seed))
    cpu = time.process_time()
    return out.ok[tenant], out.rejected[tenant], out.other[tenant], cpu, out.timings[tenant]


def open_loops(
    kiln: Kiln,
    rates: dict[str, float],
    keys: dict[str, str],
    *,
    seconds: float,
    seed: int,
    nice: int,
) -> Outcomes:
    """:func:`open_loop` with each tenant in processes of its own at CPU priority ``nice``.

    A tenant's rate is split over one process per ``SHARD_RATE`` requests/s, so that a client's
    own event loop does not queue the timings it takes (one Python process sending ~400
    requests/s measured its rejections' p99 several times what the gateway's histogram says).
    """
    shards = [
        (t, r / n, i)
        for t, r in rates.items()
        if r > 0
        for n in [max(1, math.ceil(r / SHARD_RATE))]
        for i in range(n)
    ]
    out = Outcomes()
    roles = kiln.roles()
    before = {role: cpu_seconds(procs) for role, procs in roles.items()}
    fork = multiprocessing.get_context("fork")
    with concurrent.futures.ProcessPoolExecutor(len(shards), mp_context=fork) as pool:
        timing = (time.time() + 1.0, seconds, seed, nice)
        futures = [
            (t, pool.submit(
                _tenant_process, kiln.base_url, kiln.model, t, r, keys=keys,
                timing=(*timing[:2], seed + 1000 * i, nice),
            ))
            for t, r, i in shards
        ]  # fmt: skip
        for tenant, future in futures:
            ok, rejected, other, cpu, timings = future.result()
            out.timings[tenant] += timings
            out.ok[tenant] += ok
            out.rejected[tenant] += rejected
            out.other[tenant] += other
            out.cpu["generators"] += cpu / seconds
    for role, procs in roles.items():
        out.cpu[role] = (cpu_seconds(procs) - before[role]) / (seconds + 1.0)
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
            status, _, _ = await _send(session, url, key, body)
            done += status == 200

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(client(session, i) for i in range(16)))
    return done / seconds


def server_p99(text: str, status: str) -> float:
    """Upper bound (bucket edge, ms) of the gateway's own p99 duration for /v1/embeddings
    answers with ``status``: the server side of a latency the load generator measures."""
    buckets = []
    for line in text.splitlines():
        if (
            line.startswith("kiln_request_duration_seconds_bucket{")
            and 'path="/v1/embeddings"' in line
            and f'status_code="{status}"' in line
        ):
            edge = line.split('le="')[1].split('"')[0]
            buckets.append((float(edge), float(line.rsplit(" ", 1)[1])))
    if not buckets or buckets[-1][1] == 0:
        return float("nan")
    buckets.sort()
    total = buckets[-1][1]
    return next(edge for edge, n in buckets if n >= 0.99 * total) * 1000


async def scheduler_metrics(kiln: Kiln) -> tuple[dict[str, float], float]:
    """Service shares per tenant id and Jain's index, as the gateway exports them."""
    async with (
        aiohttp.ClientSession(headers=kiln.metrics_headers()) as session,
        session.get(f"{kiln.base_url}/metrics") as r,
    ):
        text = await r.text()
    print(f"gateway-side p99 of 429 answers: <= {server_p99(text, '429'):.0f} ms (bucket edge)")
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
    parser.add_argument("--max-batch-size", type=int, help="KILN_WORKER_MAX_BATCH_SIZE")
    parser.add_argument("--worker-threads", type=int, help="KILN_WORKER_THREADS")
    parser.add_argument("--worker-concurrency", type=int, help="KILN_WORKER_CONCURRENCY")
    parser.add_argument(
        "--no-preempt", action="store_true", help="KILN_WORKER_PREEMPT=false (lane without stops)"
    )
    parser.add_argument(
        "--no-express", action="store_true", help="KILN_SCHEDULER_EXPRESS=false (no lane)"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--client-nice", type=int, default=0, help="CPU niceness of the load generators"
    )
    args = parser.parse_args(argv)
    if not (args.model_dir / "kiln.json").exists():
        from kiln_runtimes.importers import minilm

        minilm.build(args.model_dir)

    env = {"KILN_WORKER_SLOTS": str(args.slots)}
    if args.no_preempt:
        env["KILN_WORKER_PREEMPT"] = "false"
    if args.no_express:
        env["KILN_SCHEDULER_EXPRESS"] = "false"
    knobs = ("max_batch_size", "worker_threads", "worker_concurrency")
    for knob in knobs:
        if getattr(args, knob) is not None:
            env[f"KILN_WORKER_{knob.removeprefix('worker_').upper()}"] = str(getattr(args, knob))
    kiln = Kiln.start(args.model_dir, env)
    try:
        keys = {}
        for tenant in ("A", "B"):
            tenant_id = kiln.cli("tenants", "create", tenant).strip()
            keys[tenant] = kiln.cli("keys", "create", "--tenant", tenant).strip().splitlines()[-1]
            keys[tenant_id] = tenant
        cap = asyncio.run(capacity(kiln, keys["B"], args.duration / 2))
        b_rate = args.b_load * cap
        timing = {"seconds": args.duration, "nice": args.client_nice}
        alone = open_loops(kiln, {"B": b_rate}, keys, seed=args.seed, **timing)
        rates = {"A": args.a_load * cap, "B": b_rate}
        both = open_loops(kiln, rates, keys, seed=args.seed + 1, **timing)
        shares, jain = asyncio.run(scheduler_metrics(kiln))
    finally:
        kiln.stop()

    report(alone, both, shares=shares, keys=keys, jain=jain, cap=cap)
    offered = len(both.ok["A"]) + len(both.rejected["A"]) + both.other["A"]
    print(
        f"A's generator: {offered / args.duration:.0f} requests/s sent of "
        f"{args.a_load * cap:.0f} targeted (client nice {args.client_nice})"
    )
    for name, phase in (("B alone", alone), ("A + B", both)):
        cores = ", ".join(f"{role} {c:.2f}" for role, c in phase.cpu.items())
        print(f"cores used, {name}: {cores}")
        print(f"B's slowest 5%, {name} (mean ms): {_tail(phase.timings['B'])}")


def _tail(timings: list[tuple[float, dict[str, float]]], share: float = 0.05) -> str:
    """Where the slowest ``share`` of requests spent their time, from ``Server-Timing``."""
    slow = sorted(timings, key=lambda t: t[0])[-max(1, int(len(timings) * share)) :]
    parts = ("queue", "worker-queue", "compute", "total")
    means = {p: float(np.mean([t.get(p, 0.0) for _, t in slow])) for p in parts}
    means["client"] = float(np.mean([s * 1000 for s, _ in slow]))
    express = sum("express" in t for _, t in slow)
    return ", ".join(f"{k} {v:.1f}" for k, v in means.items()) + f"; express {express}/{len(slow)}"


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
