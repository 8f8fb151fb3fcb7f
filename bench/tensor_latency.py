"""Tensor latency under open-loop load: where the p99 bound of issue 5 holds on this machine.

A closed loop at concurrency 32 keeps the server saturated, so its latency is set by Little's law
(requests in flight ÷ throughput), not by the batcher. This bench sends Poisson arrivals instead,
at fractions of ONNX Runtime's in-process best rate (same model, same cores), and compares each
load's p99 (from the scheduled send time, so a slow server cannot hold arrivals back) with the
bound ``2 x (single-request p50 + max_queue_delay)``, and with an ideal server fed the same
arrivals: one engine that runs each request in the in-process time of its batch, plus the part of
Kiln's single-request latency that is not compute, with no other delay (an M/D/1 queue).

    python bench/tensor_latency.py --model encoder --items 32 --max-batch-size 32 \\
        --worker-threads 1 --worker-concurrency 1 --worker-prefetch --compute-cores 1 \\
        --loads 0.25,0.5,0.7,0.85
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import tempfile
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import tensor


async def open_loop(url: str, key: str, body: tuple[bytes, dict[str, str]], rate: float, *,
                    duration: float, seed: int) -> dict[str, Any]:  # fmt: skip
    """Poisson arrivals at ``rate`` requests/s for ``duration`` s (after 1 s of warmup)."""
    data, extra = body
    headers = {"authorization": f"Bearer {key}", "content-type": "application/octet-stream",
               **extra}  # fmt: skip
    rng, loop = random.Random(seed), asyncio.get_running_loop()
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    begin = loop.time() + 0.2
    start, end = begin + 1.0, begin + 1.0 + duration

    async def one(session: aiohttp.ClientSession, at: float) -> None:
        await asyncio.sleep(max(0.0, at - loop.time()))
        async with session.post(url, data=data, headers=headers) as resp:
            await resp.read()
        statuses[resp.status] = statuses.get(resp.status, 0) + 1
        if start <= at < end and resp.status == 200:
            latencies.append(loop.time() - at)

    arrivals, at = [], begin
    while at < end:
        arrivals.append(at)
        at += rng.expovariate(rate)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(one(session, a) for a in arrivals))
    lat = np.array(latencies) * 1000
    return {"sent_per_s": len([a for a in arrivals if start <= a < end]) / duration,
            "p50_ms": float(np.percentile(lat, 50)), "p99_ms": float(np.percentile(lat, 99)),
            "statuses": statuses}  # fmt: skip


def ideal_p99(rate: float, service_s: float, fixed_s: float, seed: int) -> float:
    """p99 latency (ms) of an ideal FIFO server with constant service time, Poisson arrivals."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / rate, 200_000))
    free, latencies = 0.0, np.empty(len(arrivals))
    for i, at in enumerate(arrivals):
        free = max(at, free) + service_s
        latencies[i] = free - at + fixed_s
    return float(np.percentile(latencies, 99) * 1000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", choices=sorted(tensor.MODELS), default="encoder")
    parser.add_argument("--items", type=int, default=32, help="items per request")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per load")
    parser.add_argument("--loads", default="0.25,0.5,0.7,0.85",
                        help="arrival rates as fractions of the in-process best")  # fmt: skip
    parser.add_argument("--max-queue-delay-ms", type=float, default=5.0)
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--worker-threads", type=int, default=1)
    parser.add_argument("--worker-concurrency", type=int, default=1)
    parser.add_argument("--worker-prefetch", action="store_true")
    parser.add_argument("--compute-cores", type=int, default=0)
    args = parser.parse_args()
    spec = tensor.MODELS[args.model]
    cores = tensor.layout(args.compute_cores)
    print(f"load before: {os.getloadavg()}; cores (host, compute): {cores or 'shared'}")
    with tempfile.TemporaryDirectory(prefix="kiln-bench-model-") as tmp:
        model = spec.build.write(Path(tmp) / f"{spec.name}.onnx")
        compute = None if cores is None else cores[1]
        batch = min(args.items, args.max_batch_size)  # a lone request's batch
        sizes = sorted({1, 2, 4, 8, 16, 32, 64, args.max_batch_size, batch})
        direct = {b: tensor.direct_best(spec, model, b, 3.0, compute) for b in sizes}
        best = max(direct.values())
        print("direct:", {b: round(v) for b, v in direct.items()}, f"best {best:.0f} items/s")
        allowed = os.sched_getaffinity(0)
        kiln = tensor.kiln_on_cores(spec, model, args, args.max_batch_size)
        try:
            url = f"{kiln.base_url}/v2/models/{spec.name}/infer"
            single = asyncio.run(tensor._loop(spec, url, kiln.key, 1, args.items, duration=5.0))
            bound = 2 * (single["p50_ms"] + args.max_queue_delay_ms)
            print(f"single request ({args.items} items): p50 {single['p50_ms']:.2f} ms; "
                  f"bound 2 x ({single['p50_ms']:.2f} + {args.max_queue_delay_ms}) = "
                  f"{bound:.1f} ms")  # fmt: skip
            body = tensor._body(spec, args.items)
            for i, load in enumerate(float(x) for x in args.loads.split(",")):
                rate = load * best / args.items
                r = asyncio.run(
                    open_loop(url, kiln.key, body, rate, duration=args.duration, seed=i)
                )
                verdict = "within" if r["p99_ms"] <= bound else "OVER"
                service = args.items / direct[batch]
                fixed = single["p50_ms"] / 1000 - service
                ideal = ideal_p99(rate, service, fixed, seed=i)
                print(f"load {load:.2f} ({rate * args.items:.0f} items/s, {rate:.1f} req/s): "
                      f"p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms, {verdict} the "
                      f"{bound:.1f} ms bound; ideal server p99 {ideal:.1f} ms "
                      f"(Kiln {r['p99_ms'] / ideal:.2f}x); statuses {r['statuses']}")  # fmt: skip
        finally:
            kiln.stop()
            os.sched_setaffinity(0, allowed)
    print(f"load after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
