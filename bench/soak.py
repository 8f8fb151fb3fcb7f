"""Soak: steady mixed traffic for a configured time, resources sampled (docs/reliability.md).

Starts its own ``kiln up`` serving all-MiniLM-L6-v2 and a small tensor model in two versions
(uploaded through the admin API), and runs, at once: embeddings on an open loop (``--rate``
req/s, one sentence each, latency from the scheduled send time), a key rotation every 5 s
through the admin API (create a key, use it, revoke it: the key cache and the audit log see a
stream of new keys), an admin read every second (the tenant's keys), ``/v1/models`` and
``/v2/health/ready`` every 2 s, OIP ``/v2`` inference on the tensor model every second, its
canary share changed every 30 s through the admin API (``_soak_mix``), and with ``--chat`` a
streamed chat on the bundled SmolLM2 every 5 s (8 tokens). Every ``--sample-s`` it samples, per
process role (gateway, workers, PostgreSQL): resident memory, open file descriptors, and the
PostgreSQL connections (its backend processes), with the embeddings p99 of that window.

After ``--warmup-s`` it reports growth, first samples against last: RSS per role (goal < 5%),
fds and connections (goal: none), and p99 drift (goal < 10%): the p99 of every embeddings
latency in the first third of the steady samples against the last third's (a 30 s window at
10 req/s holds 300 latencies, whose p99 is the fourth-largest: on a quiet machine 5-minute
medians of it moved +-25%; a third of the hour holds ~11,000); ``--json`` writes every sample.

    python bench/soak.py --duration-s 3600 --chat     # the hour
    python bench/soak.py --duration-s 180 --warmup-s 60 --json /tmp/soak.json   # CI's 3 minutes
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _corpus import embedding_bodies, sentences
from _kiln import CpuMeter, Kiln, register_as
from _soak_mix import (
    CANARY_EVERY_S,
    CHAT,
    CHAT_EVERY_S,
    V2_EVERY_S,
    Mix,
    chat_model_dir,
    upload_versions,
)
from embeddings import _model_dir, _run

from kiln_platform.pools.connections import StackConnector

_PG_AUX = ("checkpointer", "background writer", "walwriter", "autovacuum launcher",
           "logical replication launcher", "stats collector", "archiver", "startup")  # fmt: skip


@dataclass
class Sample:
    """One sampling instant: seconds since the start, per-role RSS (MiB) and fds, PostgreSQL
    connections, the latencies (ms) of the embeddings answered in the window just ended, and
    where their time went: per ``Server-Timing`` phase, its median and p99 (``gateway``: the
    total less the queues and compute; ``client``: the latency less the total). To tell Kiln
    from the machine when latency moves: CPU seconds so far per role (its live processes), the
    host's steal so far, and ``probe_ms``: the CPU time of a fixed pure-Python loop in a fresh
    process (the machine's speed: it rises if a neighbour slows the cores)."""

    t: float
    rss_mib: dict[str, float]
    fds: dict[str, int]
    connections: int
    latencies_ms: list[float] = field(default_factory=list, repr=False)
    phases_ms: dict[str, tuple[float, float]] = field(default_factory=dict)
    cpu_s: dict[str, float] = field(default_factory=dict)
    steal_s: float = 0.0
    probe_ms: float = 0.0

    @property
    def p99_ms(self) -> float:
        return _p99(self.latencies_ms)


@dataclass
class Traffic:
    """What the load saw: embeddings latencies of the current window, statuses of everything,
    the tensor model's versions that answered ``/v2``."""

    window: list[float] = field(default_factory=list)
    phases: list[dict[str, float]] = field(default_factory=list)
    statuses: Counter[str] = field(default_factory=Counter)
    versions: Counter[str] = field(default_factory=Counter)


def _connections(postgres: list[psutil.Process]) -> int:
    """PostgreSQL's client backends (``postgres: user db host(port) state``)."""
    n = 0
    for p in postgres:
        with contextlib.suppress(psutil.Error):
            title = " ".join(p.cmdline())
            if title.startswith("postgres: ") and not any(a in title for a in _PG_AUX):
                n += "(" in title or "[local]" in title
    return n


def sample(kiln: Kiln, t: float, traffic: Traffic) -> Sample:
    """Resources of each role now, and the window's embeddings p99."""
    rss: dict[str, float] = {}
    fds: dict[str, int] = {}
    cpu: dict[str, float] = {}
    roles = kiln.roles()
    for role, procs in roles.items():
        rss[role], fds[role], cpu[role] = 0.0, 0, 0.0
        for p in procs:
            with contextlib.suppress(psutil.Error):
                rss[role] += p.memory_info().rss / 2**20
                fds[role] += p.num_fds()
                cpu[role] += sum(p.cpu_times()[:2])
    window, traffic.window = traffic.window, []
    phases, traffic.phases = traffic.phases, []
    ms = [round(1000 * w, 2) for w in window]
    return Sample(
        t, rss, fds, _connections(roles["postgres"]), ms, _phase_stats(phases),
        {r: round(c, 2) for r, c in cpu.items()}, psutil.cpu_times().steal, _probe_ms(),
    )  # fmt: skip


_PROBE = "import time\nt = time.process_time()\nsum(i * i for i in range(300_000))\n" \
    "print(1000 * (time.process_time() - t))"  # fmt: skip


def _probe_ms() -> float:
    """The CPU time of a fixed loop, best of three fresh processes (the machine's speed)."""
    runs = [subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                           check=True).stdout for _ in range(3)]  # fmt: skip
    return round(min(map(float, runs)), 2)


def phases(server_timing: str, latency_ms: float) -> dict[str, float]:
    """A response's ``Server-Timing`` as ms per phase, with the gateway's own share (the total
    less every other phase) and the client's (the latency less the total)."""
    out: dict[str, float] = {}
    for part in server_timing.split(","):
        name, _, dur = part.strip().partition(";dur=")
        with contextlib.suppress(ValueError):
            out[name] = float(dur)
    total = out.pop("total", None)
    if total is None:
        return {}
    out["gateway"] = total - sum(out.values())
    out["client"] = latency_ms - total
    return out


def _phase_stats(window: list[dict[str, float]]) -> dict[str, tuple[float, float]]:
    names = sorted({name for p in window for name in p})
    values = {name: [p.get(name, 0.0) for p in window] for name in names}
    return {n: (round(statistics.median(v), 2), round(_p99(v), 2)) for n, v in values.items()}


def _p99(latencies: list[float]) -> float:
    return sorted(latencies)[int(0.99 * (len(latencies) - 1))] if latencies else 0.0


async def _embeddings(http: aiohttp.ClientSession, url: str, bodies: list[bytes], *,
                      rate: float, end: float, traffic: Traffic) -> None:  # fmt: skip
    """An open loop at ``rate``; each latency from its scheduled send time."""
    tasks, n, due = [], 0, time.perf_counter()

    async def shot(scheduled: float, body: bytes) -> None:
        timing = ""
        try:
            async with http.post(url, data=body) as resp:
                await resp.read()
                status, timing = str(resp.status), resp.headers.get("server-timing", "")
        except aiohttp.ClientError as exc:
            status = type(exc).__name__
        traffic.statuses[f"embeddings {status}"] += 1
        if status == "200":
            latency = time.perf_counter() - scheduled
            traffic.window.append(latency)
            traffic.phases.append(phases(timing, 1000 * latency))

    while due < end:
        await asyncio.sleep(max(0.0, due - time.perf_counter()))
        tasks.append(asyncio.create_task(shot(due, bodies[n % len(bodies)])))
        tasks = [t for t in tasks if not t.done()]
        n, due = n + 1, due + 1.0 / rate
    await asyncio.gather(*tasks)


async def _every(seconds: float, end: float, call: Any) -> None:
    while time.perf_counter() < end:
        await call()
        await asyncio.sleep(seconds)


async def _traffic(kiln: Kiln, keys: tuple[str, str], tenant: str, *, rate: float,
                   traffic: Traffic, end: float, chat: str | None) -> None:  # fmt: skip
    """Everything at once until ``end``; ``keys``: the tenant admin's and the platform's."""
    base, model = kiln.base_url, kiln.model
    bodies = embedding_bodies(model, sentences(500))
    user = {"authorization": f"Bearer {kiln.key}", "content-type": "application/json"}
    admin = {"authorization": f"Bearer {keys[0]}"}
    # most recent connection first, idle ones closed before the gateway's 5 s: the gateway's
    # inbound keep-alives follow the load's concurrency of the last seconds, not its peak
    connector = StackConnector(keepalive_timeout=4.0)
    async with aiohttp.ClientSession(headers=user, connector=connector) as http:
        mix = Mix(http, base, keys[1], (traffic.statuses, traffic.versions), chat)

        async def get(path: str, headers: dict[str, str] | None = None) -> None:
            async with http.get(f"{base}{path}", headers=headers) as r:
                await r.read()
                traffic.statuses[f"GET {path.split('/')[1]} {r.status}"] += 1

        async def rotate() -> None:
            keys = f"{base}/admin/v1/tenants/{tenant}/keys"
            async with http.post(keys, json={"name": "soak"}, headers=admin) as r:
                made = await r.json()
                traffic.statuses[f"create key {r.status}"] += 1
            used = {"authorization": f"Bearer {made['secret']}"}
            async with http.post(f"{base}/v1/embeddings", data=bodies[0], headers=used) as r:
                await r.read()
                traffic.statuses[f"rotated key {r.status}"] += 1
            async with http.delete(f"{keys}/{made['key']['id']}", headers=admin) as r:
                traffic.statuses[f"revoke {r.status}"] += 1

        await asyncio.gather(
            _embeddings(http, f"{base}/v1/embeddings", bodies, rate=rate, end=end, traffic=traffic),
            _every(5.0, end, rotate),
            _every(1.0, end, lambda: get(f"/admin/v1/tenants/{tenant}/keys", admin)),
            _every(2.0, end, lambda: get("/v1/models")),
            _every(2.0, end, lambda: get("/v2/health/ready")),
            _every(V2_EVERY_S, end, mix.infer),
            _every(CANARY_EVERY_S, end, mix.canary),
            *([_every(CHAT_EVERY_S, end, mix.chat)] if chat else []),
        )


async def _soak(kiln: Kiln, keys: tuple[str, str], tenant: str, args: argparse.Namespace,
                chat: str | None) -> tuple[list[Sample], Traffic]:  # fmt: skip
    await upload_versions(kiln.base_url, keys[1])
    if chat:
        await _warm_chat(kiln, chat)
    traffic, samples = Traffic(), []
    start = time.perf_counter()
    end = start + args.duration_s
    load = asyncio.create_task(
        _traffic(kiln, keys, tenant, rate=args.rate, traffic=traffic, end=end, chat=chat)
    )
    while time.perf_counter() < end:
        await asyncio.sleep(args.sample_s)
        now = time.perf_counter() - start
        samples.append(await asyncio.to_thread(sample, kiln, now, traffic))
        s = samples[-1]
        print(f"{s.t:6.0f} s  rss {_fmt(s.rss_mib)} MiB  fds {s.fds}  conns {s.connections}  "
              f"probe {s.probe_ms:.1f} ms  steal {s.steal_s:.1f} s  cpu {_fmt(s.cpu_s)} s  "
              f"p99 {s.p99_ms:.1f} ms ({len(s.latencies_ms)})  p50/p99 "
              f"{_fmt_phases(s.phases_ms)}", flush=True)  # fmt: skip
    await load
    return samples, traffic


async def _warm_chat(kiln: Kiln, model: str, timeout_s: float = 300.0) -> None:
    """Wait until the chat model answers (its worker starts on the first request)."""
    headers = {"authorization": f"Bearer {kiln.key}"}
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession(headers=headers) as http:
        while True:
            body = {**CHAT, "model": model, "stream": False}
            async with http.post(f"{kiln.base_url}/v1/chat/completions", json=body) as r:
                if r.status == 200:
                    return
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{model}: {r.status} {await r.text()}")
            await asyncio.sleep(2.0)


def _fmt_phases(stats: dict[str, tuple[float, float]]) -> str:
    return ", ".join(f"{k} {p50:.1f}/{p99:.1f}" for k, (p50, p99) in stats.items())


def _fmt(values: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.0f}" for k, v in values.items())


def _delta(first: list[Sample], last: list[Sample], value: Any) -> tuple[float, float]:
    """Mean of ``value(sample)`` over the first samples and over the last ones."""
    return statistics.fmean(map(value, first)), statistics.fmean(map(value, last))


def growth(samples: list[Sample], warmup_s: float) -> dict[str, Any]:
    """First samples after the warm-up against the last ones (three of each, or fewer); fds
    also as the lowest count of the first and of the last third (keep-alives follow the load's
    recent concurrency, so a spike lifts a sample; a leak lifts the floor); p99 over every
    latency of the first and of the last third."""
    steady = [s for s in samples if s.t > warmup_s]
    k = max(1, min(3, len(steady) // 3))
    first, last = steady[:k], steady[-k:]
    third = max(1, len(steady) // 3)  # fds' floor and the pooled p99: a third at each end
    out: dict[str, Any] = {"samples": len(steady), "compared": k}
    for role in samples[0].rss_mib:
        a, b = _delta(first, last, lambda s, r=role: s.rss_mib[r])
        out[f"rss_{role}_mib"] = [round(a, 1), round(b, 1)]
        out[f"rss_{role}_pct"] = round(100 * (b - a) / a, 2) if a else None
        a, b = _delta(first, last, lambda s, r=role: s.fds[r])
        out[f"fds_{role}"] = round(b - a, 1)
        floor = [min(s.fds[role] for s in part) for part in (steady[:third], steady[-third:])]
        out[f"fds_{role}_floor"] = floor
    a, b = _delta(first, last, lambda s: s.connections)
    out["connections"] = round(b - a, 1)
    p_first, p_last = (_p99([x for s in part for x in s.latencies_ms])
                       for part in (steady[:third], steady[-third:]))  # fmt: skip
    out["p99_first_ms"], out["p99_last_ms"] = round(p_first, 1), round(p_last, 1)
    out["p99_drift_pct"] = round(100 * (p_last - p_first) / p_first, 1) if p_first else None
    names = sorted({n for s in steady for n in s.phases_ms})
    out["phases_p50_first_last_ms"] = {  # where a drift went: each phase's median, both thirds
        n: [round(statistics.median(s.phases_ms.get(n, (0.0, 0.0))[0] for s in part), 2)
            for part in (steady[:third], steady[-third:])]
        for n in names
    }  # fmt: skip
    thirds = (steady[:third], steady[-third:])
    probes = [statistics.median(s.probe_ms for s in part) for part in thirds]
    out["probe_ms_first_last"] = [round(p, 2) for p in probes]
    out["cpu_cores_first_last"] = {  # per role, and the host's steal: cores over each third
        r: [_rate(p, lambda s, r=r: s.cpu_s.get(r, 0.0)) for p in thirds] for r in samples[0].cpu_s
    }  # fmt: skip
    out["cpu_cores_first_last"]["steal"] = [_rate(p, lambda s: s.steal_s) for p in thirds]
    windows = [statistics.median(s.p99_ms for s in part) for part in (first, last)]
    out["p99_windows_first_last_ms"] = [round(w, 1) for w in windows]  # the earlier statistic
    return out


def _rate(part: list[Sample], value: Any) -> float:
    """How fast ``value(sample)`` grew over ``part``, per second (0 over a single sample)."""
    span = part[-1].t - part[0].t
    return round((value(part[-1]) - value(part[0])) / span, 3) if span > 0 else 0.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration-s", type=float, default=3600.0)
    p.add_argument("--warmup-s", type=float, default=300.0)
    p.add_argument("--sample-s", type=float, default=10.0)
    p.add_argument("--rate", type=float, default=20.0, help="embeddings per second")
    p.add_argument("--model-dir", type=Path, help="built model (default: the test cache)")
    p.add_argument("--json", type=Path, help="write the samples and the growth here")
    p.add_argument("--chat", action="store_true", help="stream chats on SmolLM2 too")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    kiln = Kiln.start(_model_dir(args.model_dir))
    try:
        tenant = kiln.cli("tenants", "create", "soak").strip()
        admin_key = kiln.cli("keys", "create", "--tenant", "soak", "--role", "tenant-admin",
                             "--scope", "admin:read", "--scope", "admin:write"
                             ).strip().splitlines()[-1]  # fmt: skip
        kiln.cli("tenants", "create", "ops")
        ops_key = kiln.cli("keys", "create", "--tenant", "ops", "--role", "platform-admin",
                           "--scope", "admin:write", "--scope", "inference"
                           ).strip().splitlines()[-1]  # fmt: skip
        chat = register_as(kiln.env, kiln.data_dir, chat_model_dir()) if args.chat else None
        with CpuMeter(kiln.processes()) as cpu:
            samples, traffic = _run(_soak(kiln, (admin_key, ops_key), tenant, args, chat))
    finally:
        kiln.stop()
    out = growth(samples, args.warmup_s)
    out["statuses"] = dict(traffic.statuses)
    out["v2_versions"] = dict(traffic.versions)
    out["cpu_ours"], out["cpu_foreign"] = round(cpu.ours, 2), round(cpu.foreign, 2)
    out["load_average"] = os.getloadavg()
    print(json.dumps(out, indent=1))
    if args.json:
        args.json.write_text(json.dumps({"growth": out, "samples": [asdict(s) for s in samples]}))


if __name__ == "__main__":
    main()
