"""``/v1/embeddings`` latency during a console sign-in flood (see docs/benchmarks.md).

Starts its own ``kiln up`` serving all-MiniLM-L6-v2 with ``KILN_FORWARDED_ALLOW_IPS=127.0.0.1``
(the bench plays the trusted proxy, so each sign-in can come from another ``X-Forwarded-For``
address). Each round measures the embeddings load alone, then the same load while ``--flooders``
senders post sign-ins as fast as they are answered: wrong passwords for a new email each time
from a new address (so the throttle does not simply stop them: each costs an argon2 check), and
every tenth the right password of a real user. Prints the median p50/p99 of each phase and the
ratio p99 during the flood / p99 without it (the goal: at most 1.5).

    python bench/signin_flood.py          # 3 rounds of 10 s per phase, ~2 minutes
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import re
import statistics
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _corpus import embedding_bodies, sentences
from _kiln import CpuMeter, Kiln
from embeddings import _load, _model_dir, _ms

EMAIL, PASSWORD = "flood@kiln.test", "correct horse battery"
_CSRF = re.compile(r'name="_csrf_token" value="([^"]+)"')


async def _flood(base: str, flooders: int, stop: asyncio.Event, waits: list[float]
                 ) -> Counter[int]:  # fmt: skip
    """Sign-ins until ``stop``: statuses seen (303 signed in, 401 wrong, 429 throttled); the
    real user's sign-ins' seconds in ``waits``."""
    statuses: Counter[int] = Counter()
    n = itertools.count()
    jar = aiohttp.DummyCookieJar()  # no session: every post is a fresh sign-in
    async with aiohttp.ClientSession(cookie_jar=jar) as http:
        async with http.get(f"{base}/console/login") as page:
            token = _CSRF.search(await page.text())
            cookie = page.cookies["kiln_csrf"].value
        assert token
        headers = {"cookie": f"kiln_csrf={cookie}"}

        async def sender() -> None:
            while not stop.is_set():
                i = next(n)
                right = i % 10 == 0
                form = {"email": EMAIL if right else f"guess-{uuid.uuid4().hex}@kiln.test",
                        "password": PASSWORD if right else "wrong password",
                        "_csrf_token": token.group(1)}  # fmt: skip
                forwarded = f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}"
                sent = {**headers, "x-forwarded-for": forwarded}
                url = f"{base}/console/login"
                start = time.perf_counter()
                async with http.post(url, data=form, headers=sent, allow_redirects=False) as r:
                    await r.read()
                    statuses[r.status] += 1
                if right:
                    waits.append(time.perf_counter() - start)

        await asyncio.gather(*(sender() for _ in range(flooders)))
    return statuses


async def _phase(kiln: Kiln, bodies: list[bytes], args: argparse.Namespace, waits: list[float],
                 *, flood: bool) -> tuple[list[float], int, Counter[int]]:  # fmt: skip
    stop = asyncio.Event()
    flooding = (asyncio.create_task(_flood(kiln.base_url, args.flooders, stop, waits))
                if flood else None)  # fmt: skip
    latencies, errors = await _load(f"{kiln.base_url}/v1/embeddings", kiln.key, bodies,
                                    args.concurrency, warmup=args.warmup,
                                    duration=args.duration)  # fmt: skip
    stop.set()
    return latencies, errors, (await flooding) if flooding else Counter()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=float, default=10.0, help="seconds measured per phase")
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--concurrency", type=int, default=4, help="embeddings senders")
    p.add_argument("--flooders", type=int, default=32, help="sign-in senders")
    p.add_argument("--model-dir", type=Path, help="built model (default: the test cache)")
    args = p.parse_args()
    kiln = Kiln.start(_model_dir(args.model_dir), {"KILN_FORWARDED_ALLOW_IPS": "127.0.0.1"})
    try:
        kiln.cli("users", "create", "--email", EMAIL, "--role", "platform-admin",
                 "--password", PASSWORD)  # fmt: skip
        bodies = embedding_bodies(kiln.model, sentences(200))
        p99: dict[bool, list[float]] = {False: [], True: []}
        p50: dict[bool, list[float]] = {False: [], True: []}
        waits: list[float] = []  # the real user's sign-ins during the floods
        for r in range(args.rounds):
            for flood in (False, True):
                with CpuMeter(kiln.processes()) as cpu:
                    latencies, errors, statuses = asyncio.run(
                        _phase(kiln, bodies, args, waits, flood=flood)
                    )
                p50[flood].append(_ms(latencies, 50))
                p99[flood].append(_ms(latencies, 99))
                rate = sum(statuses.values()) / (args.duration + args.warmup)
                print(f"round {r + 1} {'flood' if flood else 'quiet'}: {len(latencies)} requests"
                      f" p50 {p50[flood][-1]:.1f} ms p99 {p99[flood][-1]:.1f} ms errors {errors}"
                      f" sign-ins {dict(statuses)} ({rate:.0f}/s) foreign cpu {cpu.foreign:.2f}",
                      flush=True)  # fmt: skip
    finally:
        kiln.stop()
    quiet, flooded = statistics.median(p99[False]), statistics.median(p99[True])
    print(f"quiet:  p50 {statistics.median(p50[False]):.1f} ms  p99 {quiet:.1f} ms")
    print(f"flood:  p50 {statistics.median(p50[True]):.1f} ms  p99 {flooded:.1f} ms")
    print(f"p99 ratio flood/quiet: {flooded / quiet:.2f} (goal <= 1.5)")
    if waits:
        print(f"the real user's sign-ins during the floods: {len(waits)}, median"
              f" {statistics.median(waits):.2f} s, longest {max(waits):.2f} s")  # fmt: skip


if __name__ == "__main__":
    main()
