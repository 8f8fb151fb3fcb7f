"""What shadow traffic costs the client: embeddings latency p99 with a shadow copying 20% of
requests to a candidate version, against the same ``kiln up`` copying none (see
docs/benchmarks.md).

One ``kiln up`` on all-MiniLM-L6-v2 registered twice: ``bench`` (the route's stable version,
which answers) and ``candidate`` (the same files, the shadow's candidate, its own worker). The
shadow stays configured throughout, so the candidate's worker runs in both settings: ``off`` is
``--percent 0`` (nothing copied), ``on`` is ``--percent 20``. Each round measures both at one
concurrency (one sentence per request, a closed loop of aiohttp senders: ``bench/embeddings.py``'s
load), rotating their order, so drifts of a shared machine fall on both. Prints medians over
rounds, the median of the rounds' paired p99 ratios on/off (goal <= 1.05;
``_ratios.verdict``), the share of requests actually copied in each ``on`` setting (copies are
dropped while the primary or the candidate is busy) and the gateway's shadow report.

    python bench/shadow.py            # 6 rounds of 10 s per setting, ~3 minutes
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _corpus import embedding_bodies, sentences
from _kiln import Kiln, register_as
from _ratios import verdict
from embeddings import Result, _asdict, _model_dir, measure_kiln

SETTINGS = {"off": 0, "on": 20}
GOAL = 1.05
CANDIDATE = "candidate"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=6, help="rounds; medians are reported")
    p.add_argument("--duration", type=float, default=10.0, help="measured seconds per setting")
    p.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds per setting")
    p.add_argument("--concurrency", type=int, default=4, help="closed-loop senders")
    p.add_argument("--percent", type=int, default=20, help="the share copied when on")
    p.add_argument("--model-dir", type=Path, default=None, help="a built all-MiniLM-L6-v2")
    p.add_argument("--corpus", type=int, default=2000, help="distinct sentences")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None, help="write every measurement here")
    return p.parse_args(argv)


def _with_candidate(kiln: Kiln, model_dir: Path) -> None:
    """Register the candidate, keep ``bench`` answering (a route), start the candidate's
    worker (the shadow, copying nothing yet) and wait until it serves."""
    register_as(kiln.env, kiln.data_dir, model_dir, CANDIDATE)
    kiln.cli("models", "route", kiln.model, "--stable", "bench")
    _set(kiln, 0)
    model = kiln.model
    kiln.model = f"{model}@{CANDIDATE}"
    try:
        kiln.wait_until_serving()
    finally:
        kiln.model = model
    kiln.wait_until_serving()  # and records every process it now owns (the candidate's too)


def _set(kiln: Kiln, percent: int) -> None:
    kiln.cli("models", "shadow", kiln.model, "--version", CANDIDATE, "--percent", str(percent))
    time.sleep(2.5)  # the gateway reloads its catalog every 2 s


def _report(kiln: Kiln) -> dict[str, object]:
    view = json.loads(kiln.cli("models", "shadow", kiln.model))
    reports = view["reports"]
    return reports[0] if reports else {}


def _copies(kiln: Kiln) -> tuple[float, float]:
    """(copies sent, copies dropped) so far, from the gateway's counters."""
    text = httpx.get(f"{kiln.base_url}/metrics", headers=kiln.metrics_headers(), timeout=5).text
    sent = dropped = 0.0
    for line in text.splitlines():
        if line.startswith("kiln_shadow_mirrored_total{"):
            sent += float(line.rsplit(" ", 1)[1])
        elif line.startswith("kiln_shadow_dropped_total{"):
            dropped += float(line.rsplit(" ", 1)[1])
    return sent, dropped


def _measure(args: argparse.Namespace, kiln: Kiln) -> list[dict[str, Result]]:
    bodies = embedding_bodies(kiln.model, sentences(args.corpus, seed=args.seed))
    names = list(SETTINGS)
    rounds = []
    copies: list[tuple[float, float]] = []
    for n in range(args.rounds):
        order = names[n % 2 :] + names[: n % 2]
        results = {}
        for name in order:
            _set(kiln, args.percent if name == "on" else 0)
            sent0, dropped0 = _copies(kiln)
            r = measure_kiln(bodies, args.concurrency, warmup=args.warmup,
                             duration=args.duration, kiln=kiln)  # fmt: skip
            sent, dropped = (a - b for a, b in zip(_copies(kiln), (sent0, dropped0), strict=True))
            results[name] = r
            print(f"  round {n + 1} {name:<4} {r.per_s:7.1f} sentences/s  p50 {r.p50_ms:6.1f} ms"
                  f"  p99 {r.p99_ms:6.1f} ms  (others: {r.foreign_cores:.2f} cores)"
                  + (f"  copied {_share(sent, dropped, args.percent)}" if name == "on" else ""),
                  flush=True)  # fmt: skip
            if name == "on":
                copies.append((sent, dropped))
        rounds.append(results)
    sent, dropped = (sum(c) for c in zip(*copies, strict=True))
    print(f"copied over every on setting: {_share(sent, dropped, args.percent)}")
    return rounds


def _share(sent: float, dropped: float, percent: int) -> str:
    """Copies sent of those sampled, and so the share of requests mirrored (warm-up included)."""
    chosen = sent + dropped
    kept = sent / chosen if chosen else 0.0
    return f"{sent:.0f} of {chosen:.0f} sampled ({kept:.0%}: {kept * percent:.1f}% of requests)"


def report(rounds: list[dict[str, Result]]) -> float:
    """Print the medians and the median of the rounds' p99 ratios on/off; returns it."""
    for name in SETTINGS:
        rate = statistics.median(r[name].per_s for r in rounds)
        p50 = statistics.median(r[name].p50_ms for r in rounds)
        p99 = statistics.median(r[name].p99_ms for r in rounds)
        print(f"{name:<4} median {rate:7.1f} sentences/s  p50 {p50:6.1f} ms"
              f"  p99 {p99:6.1f} ms")  # fmt: skip
    per_round = [r["on"].p99_ms / r["off"].p99_ms for r in rounds]
    return verdict("p99 ratio on/off", per_round, GOAL, higher_is_better=False)


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark; everything started is stopped, also on error."""
    args = parse_args(argv)
    model_dir = _model_dir(args.model_dir)
    print("starting kiln up ...", flush=True)
    kiln = Kiln.start(model_dir)
    try:
        _with_candidate(kiln, model_dir)
        rounds = _measure(args, kiln)
        report(rounds)
        _set(kiln, 0)
        time.sleep(6)  # the gateway persists its report every 5 s
        print("shadow report:", json.dumps(_report(kiln)))
        if args.json:
            dump = [{name: _asdict(r) for name, r in results.items()} for results in rounds]
            args.json.write_text(json.dumps(dump, indent=1))
    finally:
        kiln.stop()


if __name__ == "__main__":
    main()
