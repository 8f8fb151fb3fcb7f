"""What tracing costs: embeddings throughput with tracing off, and on at 1% sampling, against a
build without tracing (see docs/benchmarks.md).

Starts three ``kiln up`` on all-MiniLM-L6-v2 side by side (each its own data directory,
PostgreSQL and worker):

- ``baseline``: a build without tracing, from a ``git worktree`` whose ``platform/src``,
  ``runtimes/src`` and ``console/src`` are put first on ``PYTHONPATH`` (checked: the packages
  import from there, and workers inherit ``PYTHONPATH``). By default the worktree is ``HEAD``
  (commit first) with ``kiln_runtimes/tracing.py`` replaced by ``bench/_no_tracing.py``: the
  same names doing nothing and no OpenTelemetry import, tracing compiled out. ``--baseline``
  takes any revision instead (``added``: the parent of the commit that added tracing);
- ``off``: this tree, no ``OTEL_*`` (tracing off, its default);
- ``on``: this tree exporting OTLP/HTTP to a sink on loopback (a thread of this process that
  answers 200), sampling 1% (``parentbased_traceidratio``, ``0.01``).

Each round measures the three at one concurrency (one sentence per request, a closed loop of
aiohttp senders: ``bench/embeddings.py``'s load), rotating their order, so drifts of a shared
machine fall on all three. Prints medians over rounds, and the medians of the rounds' ratios
off/baseline (goal >= 0.99) and on/baseline (goal >= 0.97), in throughput and in the CPU Kiln's
processes spent per sentence. On a shared 2-core machine one 10 s sample moves by +-15% between
identical systems (``--baseline HEAD``): use many rounds, and see docs/benchmarks.md for a
profile that puts a figure on tracing's own share of the CPU.

    python bench/tracing.py            # 6 rounds of 10 s per system, ~5 minutes
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _corpus import embedding_bodies, sentences
from _kiln import Kiln, cpu_seconds
from _ratios import verdict
from embeddings import Result, _asdict, _load, _model_dir, _run, measure_kiln

REPO = Path(__file__).resolve().parents[1]
SYSTEMS = ("baseline", "off", "on")
GOALS = {"off": 0.99, "on": 0.97}
TRACING_MODULE = "runtimes/src/kiln_runtimes/tracing.py"


class Sample(NamedTuple):
    """One system in one round: the load's result, and Kiln's CPU milliseconds per sentence."""

    result: Result
    cpu_ms: float


class _Sink(BaseHTTPRequestHandler):
    """An OTLP/HTTP endpoint that takes every export and counts the bytes."""

    received = 0

    def do_POST(self) -> None:
        _Sink.received += len(self.rfile.read(int(self.headers["content-length"])))
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _before_tracing() -> str:
    """The commit before the one that added ``kiln_runtimes/tracing.py``."""
    command = ["git", "log", "--diff-filter=A", "--format=%H", "--", TRACING_MODULE]
    added = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=True)
    added_in = added.stdout.split()
    if not added_in:
        raise SystemExit("no commit adds kiln_runtimes/tracing.py: nothing to compare with")
    return f"{added_in[-1]}^"


def _baseline_path(tree: Path) -> str:
    """``PYTHONPATH`` that imports Kiln from ``tree``, checked in a fresh interpreter."""
    path = os.pathsep.join(str(tree / p / "src") for p in ("platform", "runtimes", "console"))
    code = "import kiln_platform, kiln_runtimes, kiln_console as c; print(kiln_platform.__file__, kiln_runtimes.__file__, c.__file__)"  # noqa: E501
    env = {**os.environ, "PYTHONPATH": path}
    files = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    if not all(f.startswith(str(tree)) for f in files):
        raise SystemExit(f"the baseline does not import from {tree}: {files}")
    print(f"baseline imports from {tree}")
    return path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=6, help="rounds; medians are reported")
    p.add_argument("--duration", type=float, default=10.0, help="measured seconds per system")
    p.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds per system")
    p.add_argument("--concurrency", type=int, default=8, help="closed-loop senders")
    p.add_argument("--sample", type=float, default=0.01, help="sampling ratio when on")
    p.add_argument("--baseline", default="stripped", help="'stripped' (default): this commit "
                   "with tracing compiled out (bench/_no_tracing.py over the module); or a "
                   "revision ('added': the parent of the commit that added tracing)")  # fmt: skip
    p.add_argument("--model-dir", type=Path, default=None, help="a built all-MiniLM-L6-v2")
    p.add_argument("--corpus", type=int, default=2000, help="distinct sentences")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None, help="write every measurement here")
    p.add_argument("--py-spy", type=Path, default=None, help="profile 'on' in the last round "
                   "(py-spy on PATH) into this folder; print tracing's share")  # fmt: skip
    return p.parse_args(argv)


def _start_all(model_dir: Path, baseline_path: str, sink: str, sample: float) -> dict[str, Kiln]:
    envs = {
        "baseline": {"PYTHONPATH": baseline_path},
        "off": {},
        "on": {
            "OTEL_EXPORTER_OTLP_ENDPOINT": sink,
            "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
            "OTEL_TRACES_SAMPLER_ARG": str(sample),
        },
    }
    started: dict[str, Kiln] = {}
    try:
        for name in SYSTEMS:
            print(f"starting kiln up ({name}) ...", flush=True)
            started[name] = Kiln.start(model_dir, envs[name])
    except BaseException:
        for kiln in started.values():
            kiln.stop()
        raise
    return started


def _cpu_ms(kiln: Kiln, bodies: list[bytes], args: argparse.Namespace) -> tuple[Result, float]:
    """One measurement, and the CPU milliseconds Kiln's processes (gateway, workers, PostgreSQL)
    spent per sentence in its window (the warm-up is run first, outside it)."""
    url = f"{kiln.base_url}/v1/embeddings"
    _run(_load(url, kiln.key, bodies, args.concurrency, warmup=args.warmup, duration=0.0))
    procs = kiln.processes()
    before = cpu_seconds(procs)
    r = measure_kiln(bodies, args.concurrency, warmup=0.0, duration=args.duration, kiln=kiln)
    return r, (cpu_seconds(procs) - before) * 1000 / max(1.0, r.per_s * args.duration)


def _py_spy(kiln: Kiln, args: argparse.Namespace) -> list[subprocess.Popen[bytes]]:
    """``py-spy record`` (on PATH) of the gateway and each worker over one measurement."""
    args.py_spy.mkdir(parents=True, exist_ok=True)
    seconds = str(int(args.warmup + args.duration))
    spies = []
    for role, pid in kiln.pids().items():
        out = args.py_spy / f"{role.split()[0]}-{pid}.txt"
        cmd = ["py-spy", "record", "--nonblocking", "--rate", "200", "--format", "raw",
               "-d", seconds, "-o", str(out), "-p", str(pid)]  # fmt: skip
        spies.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return spies


_TRACING = (
    "kiln_runtimes/tracing.py",
    "kiln_runtimes/_spans.py",
    "kiln_runtimes/_sampling.py",
    "tracing_middleware",
    "_server_span",
)


def _tracing_share(path: Path) -> tuple[int, int]:
    """Samples of a raw py-spy profile, and those spent in tracing: in OpenTelemetry, or where
    the innermost of Kiln's frames is tracing code (the server-span middleware's own lines, not
    the request it wraps, which runs in Kiln frames below it)."""
    total = traced = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        kiln = [f for f in stack.split(";") if "kiln_" in f]
        total += int(count)
        if "opentelemetry" in stack or (kiln and any(t in kiln[-1] for t in _TRACING)):
            traced += int(count)
    return total, traced


def _measure(args: argparse.Namespace, kilns: dict[str, Kiln]) -> list[dict[str, Sample]]:
    corpus = sentences(args.corpus, seed=args.seed)
    bodies = embedding_bodies(kilns["off"].model, corpus)
    rounds = []
    for n in range(args.rounds):
        order = SYSTEMS[n % 3 :] + SYSTEMS[: n % 3]
        results = {}
        for name in order:
            profiled = args.py_spy is not None and name == "on" and n == args.rounds - 1
            spies = _py_spy(kilns[name], args) if profiled else []
            r, cpu_ms = _cpu_ms(kilns[name], bodies, args)
            for spy in spies:
                spy.wait()
            results[name] = Sample(r, cpu_ms)
            print(f"  round {n + 1} {name:<9} {r.per_s:7.1f} sentences/s  p50 {r.p50_ms:6.1f} ms"
                  f"  p99 {r.p99_ms:6.1f} ms  {cpu_ms:5.2f} CPU ms/sentence"
                  f"  (others: {r.foreign_cores:.2f} cores)", flush=True)  # fmt: skip
        rounds.append(results)
    return rounds


def report(rounds: list[dict[str, Sample]]) -> dict[str, float]:
    """Print the medians, and the medians of each round's ratios (the systems of a round ran
    back to back, so a round's ratio cancels the machine's slower drifts): throughput, and CPU
    per sentence (the baseline's over the system's: both read "higher is better"). Returns the
    throughput ratios."""
    for name in SYSTEMS:
        per_s = statistics.median(r[name].result.per_s for r in rounds)
        p99 = statistics.median(r[name].result.p99_ms for r in rounds)
        cpu = statistics.median(r[name].cpu_ms for r in rounds)
        print(f"{name:<9} median {per_s:7.1f} sentences/s  p99 {p99:6.1f} ms"
              f"  {cpu:5.2f} CPU ms/sentence")  # fmt: skip
    ratios = {}
    for name, goal in GOALS.items():
        per_round = [r[name].result.per_s / r["baseline"].result.per_s for r in rounds]
        ratios[name] = verdict(f"ratio {name}/baseline", per_round, goal, higher_is_better=True)
        cpu_ratios = [r["baseline"].cpu_ms / r[name].cpu_ms for r in rounds]
        print(f"  CPU per sentence, baseline/{name}: {statistics.median(cpu_ratios):.3f}"
              f" (rounds {min(cpu_ratios):.3f}-{max(cpu_ratios):.3f})")  # fmt: skip
    return ratios


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark; everything started is stopped, also on error."""
    args = parse_args(argv)
    model_dir = _model_dir(args.model_dir)
    tree = Path(tempfile.mkdtemp(prefix="kiln-baseline-"))
    stripped = args.baseline == "stripped"
    rev = {"stripped": "HEAD", "added": _before_tracing()}.get(args.baseline, args.baseline)
    subprocess.run(["git", "worktree", "add", "--detach", str(tree), rev], cwd=REPO, check=True,
                   capture_output=True)  # fmt: skip
    if stripped:
        shutil.copy(REPO / "bench" / "_no_tracing.py", tree / TRACING_MODULE)
    sink = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    kilns: dict[str, Kiln] = {}
    try:
        baseline_path = _baseline_path(tree)
        endpoint = f"http://127.0.0.1:{sink.server_address[1]}"
        kilns = _start_all(model_dir, baseline_path, endpoint, args.sample)
        rounds = _measure(args, kilns)
        report(rounds)
        for profile in sorted(args.py_spy.glob("*.txt")) if args.py_spy else ():
            total, traced = _tracing_share(profile)
            print(f"py-spy {profile.stem}: {traced} of {total} samples in tracing "
                  f"({traced / max(total, 1):.2%})")  # fmt: skip
        print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        if args.json:
            dump = [
                {name: {**_asdict(x.result), "cpu_ms": x.cpu_ms} for name, x in results.items()}
                for results in rounds
            ]
            args.json.write_text(json.dumps(dump, indent=1))
    finally:
        for kiln in kilns.values():
            kiln.stop()  # the gateway and the workers export what they buffered
        sink.shutdown()
        print(f"OTLP bytes the sink received ({args.sample:.0%} sampled): {_Sink.received}")
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=REPO, check=False)
        shutil.rmtree(tree, ignore_errors=True)


if __name__ == "__main__":
    main()
