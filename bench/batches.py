"""Does a batch fill the capacity interactive traffic leaves idle, without slowing it down? One
``kiln up`` on all-MiniLM-L6-v2 (see docs/benchmarks.md).

Tenant A sends interactive embeddings requests (one sentence each, a closed loop of
``--concurrency`` senders: ``bench/embeddings.py``'s load); tenant B runs a ``--lines`` line
``/v1/embeddings`` batch (one sentence a line), uploaded and created with the openai SDK. First
the pool's capacity: A's throughput at ``--max-concurrency`` senders. Then each round measures,
``--duration`` seconds each:

- (a) A alone (no batch open): its throughput and p99;
- (b) B's batch alone (A idle): its lines/s, the batch's capacity;
- (c) both: A's p99 and the batch's lines/s.

A's share of the capacity is (a)'s throughput / the pool's; the capacity A leaves idle, for the
batch, is ``rate(b) * (1 - share)``. Per round: the p99 ratio (c)/(a) (goal <= 1.2) and the
fill ratio ``rate(c) / (rate(b) * (1 - share))`` (goal >= 0.70); the verdicts are the medians
of the rounds' ratios (``_ratios.verdict``). The batch's lines/s is counted from its
``request_counts`` (its recorded lines) at the window's ends. Each round's batch is cancelled
after (c), so a round's three settings run back to back.

    python bench/batches.py                # 3 rounds of 10 s per setting, 10,000-line batches
    python bench/batches.py --lines 2000 --rounds 1 --duration 5   # a quick look
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _corpus import embedding_bodies, sentences
from _kiln import Kiln
from _ratios import verdict
from embeddings import Result, _model_dir, measure_kiln

P99_GOAL, FILL_GOAL = 1.2, 0.70
FINAL = {"completed", "failed", "expired", "cancelled"}


@dataclass(frozen=True, slots=True)
class Round:
    """One round's three settings: A alone, the batch alone, both."""

    alone: Result
    batch_alone: float  # lines/s
    both: Result
    batch_both: float  # lines/s


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=3, help="rounds; medians are reported")
    p.add_argument("--lines", type=int, default=10_000, help="lines of each round's batch")
    p.add_argument("--duration", type=float, default=10.0, help="measured seconds per setting")
    p.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds per setting")
    p.add_argument("--concurrency", type=int, default=1, help="A's closed-loop senders")
    p.add_argument("--max-concurrency", type=int, default=16, help="senders for the capacity")
    p.add_argument("--corpus", type=int, default=4096, help="distinct sentences")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--model-dir", type=Path, default=None, help="a built all-MiniLM-L6-v2")
    p.add_argument("--kiln-env", action="append", default=[], metavar="KEY=VALUE",
                   help="env for kiln up (e.g. KILN_BATCH_CONCURRENCY=16)")  # fmt: skip
    p.add_argument("--json", type=Path, default=None, help="write every measurement here")
    return p.parse_args(argv)


def _tenant_b(kiln: Kiln) -> openai.OpenAI:
    """The SDK as a second tenant, the batch's."""
    kiln.cli("tenants", "create", "batcher")
    key = kiln.cli("keys", "create", "--tenant", "batcher").strip().splitlines()[-1]
    return openai.OpenAI(base_url=f"{kiln.base_url}/v1", api_key=key, max_retries=2)


def _submit(sdk: openai.OpenAI, model: str, corpus: list[str], lines: int) -> str:
    """Upload a ``lines``-line embeddings batch and create it; its id."""
    rows = [{"custom_id": f"r{i}", "method": "POST", "url": "/v1/embeddings",
             "body": {"model": model, "input": corpus[i % len(corpus)]}}
            for i in range(lines)]  # fmt: skip
    data = "".join(json.dumps(row) + "\n" for row in rows).encode()
    uploaded = sdk.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
    batch = sdk.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h"
    )
    return batch.id


def _done(sdk: openai.OpenAI, batch_id: str) -> int:
    counts = sdk.batches.retrieve(batch_id).request_counts
    return 0 if counts is None else counts.completed + counts.failed


def _started(sdk: openai.OpenAI, batch_id: str, warmup: float) -> None:
    """Wait until the batch runs lines, then ``warmup`` more seconds."""
    deadline = time.monotonic() + 120
    while _done(sdk, batch_id) == 0:
        if time.monotonic() > deadline:
            raise TimeoutError(f"batch {batch_id} ran no line in 120 s")
        time.sleep(0.2)
    time.sleep(warmup)


def _batch_rate(sdk: openai.OpenAI, batch_id: str, duration: float) -> float:
    """Lines/s the batch records over ``duration`` seconds."""
    before, began = _done(sdk, batch_id), time.monotonic()
    time.sleep(duration)
    return (_done(sdk, batch_id) - before) / (time.monotonic() - began)


def _end(sdk: openai.OpenAI, batch_id: str) -> None:
    """Cancel the batch and wait until it ends (its lines in flight finish)."""
    sdk.batches.cancel(batch_id)
    while sdk.batches.retrieve(batch_id).status not in FINAL:
        time.sleep(0.2)


def _round(args: argparse.Namespace, kiln: Kiln, sdk: openai.OpenAI, corpus: list[str],
           bodies: list[bytes]) -> Round:  # fmt: skip
    timing: dict[str, Any] = {"warmup": args.warmup, "duration": args.duration, "kiln": kiln}
    alone = measure_kiln(bodies, args.concurrency, **timing)
    batch_id = _submit(sdk, kiln.model, corpus, args.lines)
    try:
        _started(sdk, batch_id, args.warmup)
        batch_alone = _batch_rate(sdk, batch_id, args.duration)
        before, began = _done(sdk, batch_id), time.monotonic()
        both = measure_kiln(bodies, args.concurrency, **timing)
        batch_both = (_done(sdk, batch_id) - before) / (time.monotonic() - began)
        left = args.lines - _done(sdk, batch_id)
    finally:
        _end(sdk, batch_id)
    if left <= 0:
        print("  warning: the batch ended during the round: raise --lines", file=sys.stderr)
    return Round(alone, batch_alone, both, batch_both)


def report(rounds: list[Round], capacity: Result) -> tuple[float, float]:
    """Print the medians and the verdicts on the rounds' ratios; returns (p99, fill) ratios."""
    med = statistics.median
    print(f"pool capacity (A alone at the max concurrency): {capacity.per_s:.1f} sentences/s")
    print(f"(a) A alone        {med(r.alone.per_s for r in rounds):7.1f} sentences/s"
          f"  p99 {med(r.alone.p99_ms for r in rounds):6.1f} ms")  # fmt: skip
    print(f"(b) batch alone    {med(r.batch_alone for r in rounds):7.1f} lines/s")
    print(f"(c) A with batch   {med(r.both.per_s for r in rounds):7.1f} sentences/s"
          f"  p99 {med(r.both.p99_ms for r in rounds):6.1f} ms;"
          f" batch {med(r.batch_both for r in rounds):7.1f} lines/s")  # fmt: skip
    shares = [min(1.0, r.alone.per_s / capacity.per_s) for r in rounds]
    print(
        f"A's share of the capacity: {med(shares):.1%} (idle for the batch: {1 - med(shares):.1%})"
    )
    p99 = verdict("A's p99 ratio (c)/(a)", [r.both.p99_ms / r.alone.p99_ms for r in rounds],
                  P99_GOAL, higher_is_better=False)  # fmt: skip
    fills = [r.batch_both / (r.batch_alone * (1 - s)) for r, s in zip(rounds, shares, strict=True)]
    fill = verdict("batch fill of A's idle capacity", fills, FILL_GOAL, higher_is_better=True)
    return p99, fill


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark; everything started is stopped, also on error."""
    args = parse_args(argv)
    model_dir = _model_dir(args.model_dir)
    extra_env = dict(kv.split("=", 1) for kv in args.kiln_env)
    print(f"starting kiln up{' with ' + str(extra_env) if extra_env else ''} ...", flush=True)
    kiln = Kiln.start(model_dir, extra_env)
    try:
        sdk = _tenant_b(kiln)
        corpus = sentences(args.corpus, seed=args.seed)
        bodies = embedding_bodies(kiln.model, corpus)
        capacity = measure_kiln(bodies, args.max_concurrency, warmup=args.warmup,
                                duration=args.duration, kiln=kiln)  # fmt: skip
        rounds = []
        for n in range(args.rounds):
            r = _round(args, kiln, sdk, corpus, bodies)
            print(f"  round {n + 1}: (a) {r.alone.per_s:6.1f}/s p99 {r.alone.p99_ms:6.1f} ms"
                  f"  (b) {r.batch_alone:6.1f} lines/s  (c) {r.both.per_s:6.1f}/s"
                  f" p99 {r.both.p99_ms:6.1f} ms, {r.batch_both:6.1f} lines/s"
                  f"  (others: {max(r.alone.foreign_cores, r.both.foreign_cores):.2f} cores)",
                  flush=True)  # fmt: skip
            rounds.append(r)
        report(rounds, capacity)
        if args.json:
            dump = {"capacity": capacity.per_s, "rounds": [
                {"alone": r.alone.per_s, "alone_p99_ms": r.alone.p99_ms, "batch_alone":
                 r.batch_alone, "both": r.both.per_s, "both_p99_ms": r.both.p99_ms,
                 "batch_both": r.batch_both} for r in rounds]}  # fmt: skip
            args.json.write_text(json.dumps(dump, indent=1))
    finally:
        kiln.stop()


if __name__ == "__main__":
    main()
