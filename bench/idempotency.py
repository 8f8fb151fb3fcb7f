"""The cost of the Idempotency-Key middleware (see docs/benchmarks.md).

Starts its own ``kiln up`` with all-MiniLM-L6-v2 and sends one-sentence embeddings requests in a
closed loop of ``--concurrency`` senders, in three modes per round (their order rotating):

- ``none``: no header, the path every request without a key takes;
- ``fresh``: a new key per request (authenticate, fingerprint, claim, run, store);
- ``replay``: keys already answered (authenticate, fingerprint, read, replay; no model run).

Prints requests/s and latency per mode (medians over rounds) and the ratios to ``none``; and, in
process, what the middleware adds to a request without the header (ns per call, against the
bare inner app).

    python bench/idempotency.py               # 3 rounds of 5 s per mode, about 2 minutes
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _kiln import Kiln
from embeddings import _model_dir

MODES = ("none", "fresh", "replay")


async def _load(kiln: Kiln, mode: str, keys: list[str], concurrency: int, duration: float) -> Any:
    """Closed loop for ``duration`` s; (requests/s, p50 ms, p99 ms, errors)."""
    url = f"{kiln.base_url}/v1/embeddings"
    body = f'{{"model": "{kiln.model}", "input": ["a cat sits on the mat"]}}'.encode()
    cycle = itertools.cycle(keys)
    latencies: list[float] = []
    errors = 0
    end = time.perf_counter() + duration

    def headers() -> dict[str, str]:
        if mode == "none":
            return {}
        return {"idempotency-key": next(cycle) if mode == "replay" else uuid.uuid4().hex}

    async def sender(session: aiohttp.ClientSession) -> None:
        nonlocal errors
        while (sent := time.perf_counter()) < end:
            async with session.post(url, data=body, headers=headers()) as resp:
                await resp.read()
                replayed = resp.headers.get("idempotent-replayed") == "true"
                if resp.status != 200 or replayed != (mode == "replay"):
                    errors += 1
            latencies.append(time.perf_counter() - sent)

    common = {"authorization": f"Bearer {kiln.key}", "content-type": "application/json"}
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, headers=common) as session:
        await asyncio.gather(*(sender(session) for _ in range(concurrency)))
    ms = np.percentile(latencies, [50, 99]) * 1000
    return len(latencies) / duration, float(ms[0]), float(ms[1]), errors


async def _store_keys(kiln: Kiln, n: int) -> list[str]:
    """``n`` keys whose answers are stored, for the replay mode."""
    keys = [f"bench-{uuid.uuid4().hex}" for _ in range(n)]
    body = {"model": kiln.model, "input": ["a cat sits on the mat"]}
    async with aiohttp.ClientSession(headers={"authorization": f"Bearer {kiln.key}"}) as session:
        for key in keys:
            async with session.post(
                f"{kiln.base_url}/v1/embeddings", json=body, headers={"idempotency-key": key}
            ) as resp:
                assert resp.status == 200, await resp.text()
    return keys


def _fast_path_ns(calls: int = 200_000) -> tuple[float, float]:
    """ns per call of a bare ASGI app, and of the same app behind the middleware (no header)."""
    from kiln_platform.idempotency.middleware import idempotency_middleware

    async def inner(scope: Any, receive: Any, send: Any) -> None:
        return None

    wrapped = idempotency_middleware(inner, errors=lambda r, e: None)  # type: ignore[arg-type,return-value]
    scope = {
        "type": "http", "method": "POST", "path": "/v1/embeddings", "query_string": b"",
        "headers": [(b"host", b"x"), (b"authorization", b"Bearer k"), (b"content-type", b"json"),
                    (b"user-agent", b"OpenAI/Python"), (b"accept", b"application/json")],
    }  # fmt: skip

    async def run(app: Any) -> float:
        start = time.perf_counter_ns()
        for _ in range(calls):
            await app(scope, None, None)
        return (time.perf_counter_ns() - start) / calls

    bare = min(asyncio.run(run(inner)) for _ in range(3))
    behind = min(asyncio.run(run(wrapped)) for _ in range(3))
    return bare, behind


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and print its table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--model-dir", type=Path)
    args = parser.parse_args(argv)
    bare, behind = _fast_path_ns()
    print(f"middleware, no header, in process: {behind - bare:+.0f} ns per request"
          f" ({bare:.0f} ns bare app, {behind:.0f} ns behind the middleware)")  # fmt: skip
    kiln = Kiln.start(_model_dir(args.model_dir))
    try:
        keys = asyncio.run(_store_keys(kiln, 200))
        asyncio.run(_load(kiln, "none", keys, args.concurrency, 2.0))  # warm-up
        results: dict[str, list[Any]] = {m: [] for m in MODES}
        for r in range(args.rounds):
            for mode in MODES[r % 3 :] + MODES[: r % 3]:
                results[mode].append(
                    asyncio.run(_load(kiln, mode, keys, args.concurrency, args.duration))
                )
    finally:
        kiln.stop()
    base = statistics.median(x[0] for x in results["none"])
    print(f"\nconcurrency {args.concurrency}, {args.rounds} rounds of {args.duration:.0f} s")
    print(f"{'mode':<8}{'req/s':>9}{'ratio':>8}{'p50 ms':>9}{'p99 ms':>9}{'errors':>8}")
    for mode, rows in results.items():
        per_s = statistics.median(x[0] for x in rows)
        p50 = statistics.median(x[1] for x in rows)
        p99 = statistics.median(x[2] for x in rows)
        errors = sum(x[3] for x in rows)
        print(f"{mode:<8}{per_s:>9.0f}{per_s / base:>8.3f}{p50:>9.2f}{p99:>9.2f}{errors:>8}")


if __name__ == "__main__":
    main()
