"""Overload: a burst of 10x capacity for 30 s against ``/v1/embeddings`` (docs/benchmarks.md).

Starts its own ``kiln up`` serving all-MiniLM-L6-v2 (one worker). Measures the capacity with a
closed loop, then runs an open loop (arrivals on a fixed clock, independent of answers; each
latency counted from its *scheduled* send time, so a client that falls behind does not hide
queueing): the baseline at half the capacity, the burst at ten times it, then half again. Every
request carries a deadline (``x-kiln-timeout``). Reports:

- shed latency: how fast refused requests (429, 503 + Retry-After) are refused, p50/p99; and
  apart, the 504s (a deadline too short at admission, or expired while queued or computing);
- admitted latency during the burst, p50/p99 and how many 200s came after their deadline;
- recovery: seconds from the burst's end to the first 1 s window from which every window's p99
  is within 1.5x the baseline p99 (and the throughput back to the offered rate).

    python bench/overload.py                 # ~2 minutes
    python bench/overload.py --burst-s 10    # shorter
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _corpus import sentences
from _kiln import CpuMeter, Kiln
from embeddings import _load, _model_dir, _run

REFUSED = (429, 503)
"""Shed at the door with a Retry-After; a 504 (deadline too short at admission, or expired
while queued or on the worker) is reported apart: one that waited its deadline out is slow by
design."""


@dataclass
class Shot:
    """One request of the open loop: when it was due (s from the loop's start), how long it
    took from then, its status (0: no answer)."""

    due: float
    seconds: float
    status: int
    server_s: float = 0.0
    """The gateway's own time to the response headers (``Server-Timing: total``)."""


@dataclass
class Loop:
    """An open loop's shots and what the client saw."""

    shots: list[Shot] = field(default_factory=list)
    late_sends: int = 0  # arrivals the client sent more than 50 ms late (its own saturation)


def _bodies(model: str, inputs: int) -> list[bytes]:
    texts = sentences(64 * inputs)
    return [json.dumps({"model": model, "input": texts[i : i + inputs],
                        "encoding_format": "base64"}).encode()
            for i in range(0, len(texts), inputs)]  # fmt: skip


async def _open_loop(
    url: str, headers: dict[str, str], bodies: list[bytes], phases: list[tuple[float, float]]
) -> Loop:
    """Send at ``rate`` req/s for ``seconds``, phase after phase; wait for every answer."""
    loop, tasks = Loop(), []
    connector = aiohttp.TCPConnector(limit=1024)
    async with aiohttp.ClientSession(connector=connector, headers=headers) as http:

        async def shot(due: float, started: float, body: bytes) -> None:
            try:
                async with http.post(url, data=body) as resp:
                    await resp.read()
                    status = resp.status
                    server = _server_total(resp.headers.get("server-timing", ""))
            except aiohttp.ClientError:
                status, server = 0, 0.0
            loop.shots.append(Shot(due, time.perf_counter() - started - due, status, server))

        start, due, n = time.perf_counter(), 0.0, 0
        for rate, seconds in phases:
            end = due + seconds
            while due < end:
                wait = start + due - time.perf_counter()
                if wait > 0:
                    await asyncio.sleep(wait)
                elif wait < -0.05:
                    loop.late_sends += 1
                tasks.append(asyncio.create_task(shot(due, start, bodies[n % len(bodies)])))
                n += 1
                due += 1.0 / rate
        await asyncio.gather(*tasks)
    return loop


def _server_total(header: str) -> float:
    """Seconds of ``total;dur=<ms>`` in a ``Server-Timing`` header (0 without one)."""
    for part in header.split(","):
        name, _, dur = part.strip().partition(";dur=")
        if name == "total":
            return float(dur) / 1000
    return 0.0


def _q(values: list[float], q: float) -> float:
    """The ``q``-th percentile in ms (0 for no values)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return 1000 * ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def _windows(shots: list[Shot], start: float, end: float) -> list[tuple[float, float, int]]:
    """Per 1 s window of due times in [start, end): (window start, p99 of 200s in ms, 200s)."""
    out = []
    t = start
    while t < end:
        ok = [s.seconds for s in shots if t <= s.due < t + 1 and s.status == 200]
        out.append((t, _q(ok, 99), len(ok)))
        t += 1
    return out


def _recovery(windows: list[tuple[float, float, int]], burst_end: float, bound_ms: float,
              rate: float) -> float | None:  # fmt: skip
    """Seconds from ``burst_end`` to the first window from which all are within ``bound_ms``
    and serve at least 80% of the offered ``rate``."""
    good = [p99 <= bound_ms and n >= 0.8 * rate for _, p99, n in windows]
    for i in range(len(windows)):
        if all(good[i:]):
            return windows[i][0] - burst_end
    return None


def report(
    loop: Loop, args: argparse.Namespace, capacity: float, base_p99: float
) -> dict[str, Any]:
    """The burst's and the recovery's figures (printed and returned)."""
    b0, b1 = args.baseline_s, args.baseline_s + args.burst_s
    burst = [s for s in loop.shots if b0 <= s.due < b1]
    statuses = Counter(s.status for s in burst)
    shed = [s.seconds for s in burst if s.status in REFUSED]
    timed_out = [s.seconds for s in burst if s.status == 504]
    admitted = [s.seconds for s in burst if s.status == 200]
    late = [s for s in burst if s.status == 200 and s.seconds > args.deadline]
    windows = _windows(loop.shots, b1, b1 + args.after_s)
    after = Counter(s.status for s in loop.shots if s.due >= b1)
    recovered = _recovery(windows, b1, 1.5 * base_p99, capacity * args.base_share)
    out = {
        "capacity_rps": round(capacity, 1), "baseline_p99_ms": round(base_p99, 1),
        "offered_rps": round(capacity * args.factor, 1), "sent": len(burst),
        "statuses": dict(statuses), "admitted_rps": round(len(admitted) / args.burst_s, 1),
        "shed_p50_ms": round(_q(shed, 50), 1), "shed_p99_ms": round(_q(shed, 99), 1),
        "504_p50_ms": round(_q(timed_out, 50), 1), "504_p99_ms": round(_q(timed_out, 99), 1),
        "admitted_p50_ms": round(_q(admitted, 50), 1),
        "admitted_p99_ms": round(_q(admitted, 99), 1),
        "deadline_ms": args.deadline * 1000, "admitted_past_deadline": len(late),
        # where the late ones spent their time: in the gateway (from its first middleware to
        # the response headers), or outside it (before the app saw them, and the body's way out)
        "late_server_p50_ms": round(_q([s.server_s for s in late], 50), 1),
        "late_outside_p50_ms": round(_q([s.seconds - s.server_s for s in late], 50), 1),
        "recovery_s": recovered, "after_statuses": dict(after),
        "client_late_sends": loop.late_sends,
        "after_windows": [(round(t - b1), round(p, 1), n) for t, p, n in windows],
    }  # fmt: skip
    print(json.dumps({k: v for k, v in out.items() if k != "after_windows"}, indent=1))
    print("after the burst (s, p99 ms, answered):", out["after_windows"], flush=True)
    return out


def _phases(args: argparse.Namespace, capacity: float) -> list[tuple[float, float]]:
    base = capacity * args.base_share
    return [(base, args.baseline_s), (capacity * args.factor, args.burst_s), (base, args.after_s)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--factor", type=float, default=10.0, help="the burst, times the capacity")
    p.add_argument("--burst-s", type=float, default=30.0)
    p.add_argument("--baseline-s", type=float, default=15.0)
    p.add_argument("--after-s", type=float, default=30.0)
    p.add_argument("--base-share", type=float, default=0.5, help="of capacity, before/after")
    p.add_argument("--deadline", type=float, default=2.0, help="x-kiln-timeout, seconds")
    p.add_argument("--inputs", type=int, default=16, help="sentences per request")
    p.add_argument("--model-dir", type=Path, help="built model (default: the test cache)")
    p.add_argument("--env", action="append", default=[], help="KEY=VALUE for kiln up")
    args = p.parse_args()
    env = dict(kv.split("=", 1) for kv in args.env)
    kiln = Kiln.start(_model_dir(args.model_dir), env)
    try:
        url = f"{kiln.base_url}/v1/embeddings"
        bodies = _bodies(kiln.model, args.inputs)
        served, _ = _run(_load(url, kiln.key, bodies, 8, warmup=3.0, duration=10.0))
        capacity = len(served) / 10.0
        print(f"capacity (closed loop, 8 senders): {capacity:.1f} req/s "
              f"of {args.inputs} sentences", flush=True)  # fmt: skip
        headers = {"authorization": f"Bearer {kiln.key}", "content-type": "application/json",
                   "x-kiln-timeout": str(args.deadline)}  # fmt: skip
        with CpuMeter(kiln.processes()) as cpu:
            loop = _run(_open_loop(url, headers, bodies, _phases(args, capacity)))
        base = [s.seconds for s in loop.shots if s.due < args.baseline_s and s.status == 200]
        print(f"baseline at {args.base_share:g}x: p50 {statistics.median(base) * 1000:.1f} ms "
              f"p99 {_q(base, 99):.1f} ms", flush=True)  # fmt: skip
        out = report(loop, args, capacity, _q(base, 99))
        print(f"cpu: kiln+bench {cpu.ours:.2f} cores, other processes {cpu.foreign:.2f} cores; "
              f"load average {os.getloadavg()[0]:.2f}")  # fmt: skip
        verdict = out["shed_p99_ms"] < 50 and out["admitted_past_deadline"] == 0
        print(f"shed p99 < 50 ms and no admitted request past its deadline: {verdict}")
    finally:
        kiln.stop()


if __name__ == "__main__":
    main()
