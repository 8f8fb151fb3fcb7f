"""Tensor inference: Kiln's `/v2` vs ONNX Runtime in-process, on a compute-heavy model.

Builds ``--model``: the CNN of ``bench/models/make_cnn.py`` (77 MFLOPs and 48 KiB of input per
image) or the transformer encoder of ``bench/models/make_encoder.py`` (52 MFLOPs and 256 bytes
per item), then in one run measures:

1. ONNX Runtime in this process at batch sizes 1..64 and ``--max-batch-size``, before and after
   the Kiln runs (the better figure of the two counts): the best batch size.
2. Kiln (``kiln up`` on a fresh data dir; the model uploaded with ``kiln models upload``):
   single-request latency, then a closed loop at ``--concurrency`` over OIP binary tensors.
3. The same Kiln with ``KILN_WORKER_MAX_BATCH_SIZE=1``: the batching speedup.
4. Worker start: first start (engine compiled: cache miss) vs second (cache hit), medians of 3.
5. The int8 engine: accuracy report vs fp32 and in-process throughput change.

    python bench/tensor.py --duration 10 [--model encoder] [--items 8]
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import msgspec
import numpy as np
import onnxruntime as ort
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _kiln import CpuMeter, Kiln, free_port
from models import make_cnn, make_encoder


class Model(msgspec.Struct, frozen=True):
    """A bench model: its builder and one input."""

    name: str
    build: Any  # the module: write(path), flops()
    input: str
    output: str
    shape: tuple[int, ...]  # one item's
    datatype: str  # OIP

    def items(self, n: int, seed: int) -> np.ndarray:
        rng = np.random.default_rng(seed)
        if self.datatype == "INT64":
            return rng.integers(0, make_encoder.VOCAB, (n, *self.shape))
        return rng.standard_normal((n, *self.shape)).astype(np.float32)


MODELS = {
    "cnn": Model("cnn", make_cnn, "image", "logits", (3, 64, 64), "FP32"),
    "encoder": Model("encoder", make_encoder, "tokens", "embedding", (make_encoder.SEQ,), "INT64"),
}


def direct(
    spec: Model, model: Path, batch: int, duration: float, threads: int, *, runs: int = 1
) -> float:
    """Images per second, ONNX Runtime in-process at one batch size.

    ``runs`` Python threads call ``run`` on one session at the same time, each with
    ``threads`` intra-op threads (``runs=cores, threads=1``: one batch per core).
    """
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    feed = {spec.input: spec.items(batch, 0)}
    for _ in range(5):
        session.run(None, feed)
    counts = [0] * runs
    start = time.perf_counter()

    def loop(i: int) -> None:
        while time.perf_counter() - start < duration:
            session.run(None, feed)
            counts[i] += batch

    with concurrent.futures.ThreadPoolExecutor(runs) as pool:
        list(pool.map(loop, range(runs)))
    return sum(counts) / (time.perf_counter() - start)


def direct_best(
    spec: Model, model: Path, batch: int, duration: float, cores: set[int] | None
) -> float:
    """The better of one batch at a time on every core and one batch per core at once, on
    ``cores`` (``None``: all of them)."""
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores or allowed)  # threads started from here inherit it
    n = len(cores or allowed)
    try:
        return max(
            direct(spec, model, batch, duration, n), direct(spec, model, batch, duration, 1, runs=n)
        )
    finally:
        os.sched_setaffinity(0, allowed)


def layout(compute_cores: int) -> tuple[set[int], set[int]] | None:
    """``(host cores, compute cores)`` for ``--compute-cores``; ``None`` shares every core."""
    if not compute_cores:
        return None
    cores = sorted(os.sched_getaffinity(0))
    if compute_cores >= len(cores):
        raise SystemExit("--compute-cores must leave at least one core to the host")
    return set(cores[:-compute_cores]), set(cores[-compute_cores:])


def _body(spec: Model, items: int) -> tuple[bytes, dict[str, str]]:
    x = spec.items(items, 1)
    header = json.dumps({
        "inputs": [{"name": spec.input, "shape": list(x.shape), "datatype": spec.datatype,
                    "parameters": {"binary_data_size": x.nbytes}}],
        "outputs": [{"name": spec.output, "parameters": {"binary_data": True}}],
    }).encode()  # fmt: skip
    return header + x.tobytes(), {"inference-header-content-length": str(len(header))}


async def _loop(
    spec: Model, url: str, key: str, concurrency: int, items: int, *, duration: float
) -> dict[str, Any]:
    body, extra = _body(spec, items)
    headers = {
        "authorization": f"Bearer {key}",
        "content-type": "application/octet-stream",
        **extra,
    }
    latencies: list[float] = []
    errors = 0
    start = time.perf_counter() + 1.0  # one second of warmup
    end = start + duration

    async def sender(session: aiohttp.ClientSession) -> None:
        nonlocal errors
        while (sent := time.perf_counter()) < end:
            async with session.post(url, data=body, headers=headers) as resp:
                await resp.read()
                ok = resp.status == 200
            done = time.perf_counter()
            if start <= done <= end and ok:
                latencies.append(done - sent)
            elif start <= done <= end:
                errors += 1

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(sender(session) for _ in range(concurrency)))
    lat = np.array(latencies) * 1000
    return {
        "per_s": len(latencies) * items / duration,
        "p50_ms": float(np.percentile(lat, 50)),
        "p99_ms": float(np.percentile(lat, 99)),
        "errors": errors,
    }


def start_kiln(spec: Model, model: Path, env_extra: dict[str, str]) -> Kiln:
    """``kiln up`` on a fresh data dir with the model uploaded; returns when it is ready."""
    data_dir = Path(tempfile.mkdtemp(prefix="kiln-bench-"))
    env = {**os.environ, "KILN_DATA_DIR": str(data_dir), "KILN_LOG_LEVEL": "warning", **env_extra}
    env.pop("KILN_DATABASE_URL", None)
    kiln = Kiln(data_dir, env, model=spec.name)
    try:
        kiln.cli("tenants", "create", "bench")
        kiln.key = kiln.cli("keys", "create", "--tenant", "bench").strip().splitlines()[-1]
        kiln.cli("models", "upload", spec.name, str(model))
        port = free_port()
        kiln.base_url = f"http://127.0.0.1:{port}"
        kiln.proc = subprocess.Popen(
            [sys.executable, "-m", "kiln_console", "up", "--no-import", "--port", str(port)],
            env=env, stdout=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 180
        auth = {"authorization": f"Bearer {kiln.key}"}
        while time.monotonic() < deadline:
            try:
                url = f"{kiln.base_url}/v2/models/{spec.name}/ready"
                r = httpx.get(url, headers=auth, timeout=2)
                if r.status_code == 200:
                    kiln._owned = kiln.processes()
                    return kiln
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"{spec.name} not ready")
    except BaseException:
        kiln.stop()
        raise


def kiln_on_cores(spec: Model, model: Path, args: argparse.Namespace, max_batch: int) -> Kiln:
    """``start_kiln`` with the bench's worker options; with ``--compute-cores``, ``kiln up``,
    PostgreSQL, this client and the workers' event loops go on the host cores and the engine
    threads on the others (restore this process's affinity after ``stop``)."""
    env = {"KILN_WORKER_MAX_BATCH_SIZE": str(max_batch),
           "KILN_WORKER_MAX_WAIT_MS": str(args.max_queue_delay_ms),
           "KILN_WORKER_THREADS": str(args.worker_threads),
           "KILN_WORKER_CONCURRENCY": str(args.worker_concurrency),
           "KILN_WORKER_PREFETCH": str(args.worker_prefetch).lower()}  # fmt: skip
    cores = layout(args.compute_cores)
    if cores is not None:
        os.sched_setaffinity(0, cores[0])
        env["KILN_WORKER_CPUS"] = ",".join(map(str, sorted(cores[1])))
    return start_kiln(spec, model, env)


def measure_kiln(
    spec: Model, model: Path, args: argparse.Namespace, max_batch: int
) -> dict[str, Any]:
    """Single-request latency, then the concurrency loop, on a fresh Kiln."""
    allowed = os.sched_getaffinity(0)
    kiln = kiln_on_cores(spec, model, args, max_batch)
    try:
        url = f"{kiln.base_url}/v2/models/{spec.name}/infer"
        single = asyncio.run(_loop(spec, url, kiln.key, 1, args.items, duration=args.duration / 2))
        procs = {name: psutil.Process(pid) for name, pid in kiln.pids().items()}
        procs["client"] = psutil.Process()
        before = {name: sum(p.cpu_times()[:2]) for name, p in procs.items()}
        with CpuMeter(kiln.processes()) as cpu:
            loaded = asyncio.run(
                _loop(spec, url, kiln.key, args.concurrency, args.items, duration=args.duration)
            )
        requests = loaded["per_s"] * args.duration / args.items
        used: dict[str, float] = {}
        for name, p in procs.items():  # workers (a standby's too) count together
            role = name.split()[0]
            used[role] = used.get(role, 0.0) + sum(p.cpu_times()[:2]) - before[name]
        # The warm-up second counts too: a slight overestimate.
        loaded["cpu_ms_per_request"] = {k: round(v / requests * 1000, 3) for k, v in used.items()}
        loaded["foreign_cores"] = cpu.foreign
        return {"single": single, "loaded": loaded}
    finally:
        kiln.stop()
        os.sched_setaffinity(0, allowed)


def _worker_start(model_dir: Path, standby: bool) -> tuple[float, float, str]:
    """Seconds to a ready worker (and its load phase): a new process, or a preloaded standby
    (``kiln_runtimes._standby``) handed the model, as the pool supervisor does."""
    from kiln_runtimes.protocol import WORKER_SECRET_ENV

    port, secret = free_port(), "bench-worker-secret"
    env, auth = {**os.environ, WORKER_SECRET_ENV: secret}, {"authorization": f"Bearer {secret}"}
    argv = ["--model-dir", str(model_dir), "--port", str(port), "--log-level", "warning"]
    cmd = [sys.executable, "-m", "kiln_runtimes"]
    if standby:
        proc = subprocess.Popen(
            [*cmd, "--standby"], stdin=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env
        )
        time.sleep(3)  # preloaded by then (imports take ~0.4 s)
        begin = time.perf_counter()
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(argv).encode() + b"\n")
        proc.stdin.close()
    else:
        begin = time.perf_counter()
        proc = subprocess.Popen([*cmd, *argv], stderr=subprocess.DEVNULL, env=env)
    try:
        while True:
            try:
                if (
                    httpx.get(
                        f"http://127.0.0.1:{port}/health", headers=auth, timeout=1
                    ).status_code
                    == 200
                ):
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.002)
        total = time.perf_counter() - begin
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", headers=auth).text
        load = next(
            float(x.split()[1])
            for x in text.splitlines()
            if x.startswith("kiln_worker_load_seconds ")
        )
        cache = next(x for x in text.splitlines() if x.startswith("kiln_worker_engine_cache_total"))
        return total, load, cache
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def _stored(spec: Model, model: Path, root: Path) -> tuple[Any, Path]:
    """A fresh store holding the model as a registered tree would (manifest from validation)."""
    from kiln_platform.registry import validation
    from kiln_runtimes.protocol import ModelManifest
    from kiln_runtimes.store import ArtifactStore

    folder = root / spec.name
    folder.mkdir(parents=True)
    (folder / "model.onnx").write_bytes(model.read_bytes())
    checked = validation.inspect(folder, 7, 23)
    manifest = ModelManifest(
        name=spec.name, task="tensor", engine="onnxruntime", tokenizer_file=None,
        inputs=checked.inputs, outputs=checked.outputs, batching=checked.batching,
    )  # fmt: skip
    (folder / "kiln.json").write_bytes(msgspec.json.encode(manifest))
    store = ArtifactStore(root / "store")
    return store, store.path(store.put_dir(folder))


def measure_starts(spec: Model, model: Path, repeats: int) -> dict[str, Any]:
    """First start (engine compiled: cache miss) vs second (cache hit), as new processes and
    from a standby; medians."""
    out: dict[str, Any] = {"repeats": repeats}
    for mode in ("process", "standby"):
        cold, warm = [], []
        for _ in range(repeats):
            with tempfile.TemporaryDirectory(prefix="kiln-bench-store-") as tmp:
                _, tree = _stored(spec, model, Path(tmp))
                cold.append(_worker_start(tree, mode == "standby"))
                warm.append(_worker_start(tree, mode == "standby"))
        assert all("miss" in c[2] for c in cold)
        assert all("hit" in w[2] for w in warm)
        med = lambda xs: float(np.median(xs))  # noqa: E731
        out[mode] = {
            "cold_start_s": med([c[0] for c in cold]), "cold_load_s": med([c[1] for c in cold]),
            "warm_start_s": med([w[0] for w in warm]), "warm_load_s": med([w[1] for w in warm]),
        }  # fmt: skip
    return out


def measure_int8(spec: Model, model: Path, duration: float, threads: int) -> dict[str, Any]:
    """The int8 engine's accuracy report and in-process throughput vs the fp32 engine."""
    from kiln_runtimes.compile import compile_engine

    with tempfile.TemporaryDirectory(prefix="kiln-bench-store-") as tmp:
        store, tree = _stored(spec, model, Path(tmp))
        digest = f"sha256:{tree.name}"
        fp32, _ = compile_engine(store, digest, target="cpu", precision="fp32", threads=threads)
        int8, report = compile_engine(
            store, digest, target="cpu", precision="int8", threads=threads
        )
        batch = 16
        fp32_s = direct(spec, fp32 / "model.onnx", batch, duration, threads)
        int8_s = direct(spec, int8 / "model.onnx", batch, duration, threads)
    return {"max_abs_diff": report.max_abs_diff, "cosine": report.cosine,
            "fp32_engine_per_s": fp32_s, "int8_engine_per_s": int8_s, "batch": batch}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--model", choices=sorted(MODELS), default="cnn")
    parser.add_argument("--items", type=int, default=1, help="items (images) per request")
    parser.add_argument(
        "--throughput-only", action="store_true", help="skip the start and int8 measurements"
    )
    parser.add_argument("--max-queue-delay-ms", type=float, default=5.0)
    parser.add_argument("--max-batch-size", type=int, default=32, help="the batched Kiln's")
    parser.add_argument(
        "--worker-threads", type=int, default=os.cpu_count() or 1, help="intra-op, per batch"
    )
    parser.add_argument("--worker-concurrency", type=int, default=1, help="batches at once")
    parser.add_argument(
        "--worker-prefetch", action="store_true", help="KILN_WORKER_PREFETCH: a full batch waits "
        "for each busy runner, so none waits for the event loop",
    )  # fmt: skip
    parser.add_argument(
        "--compute-cores", type=int, default=0,
        help="pin Kiln's workers (and the in-process reference) to this many cores, and the "
        "gateway, PostgreSQL and the client to the others (0: everything shares every core)",
    )  # fmt: skip
    args = parser.parse_args()
    spec = MODELS[args.model]
    threads = os.cpu_count() or 1
    cores = layout(args.compute_cores)
    compute = None if cores is None else cores[1]
    print(f"load before: {os.getloadavg()}; {threads} cores; onnxruntime {ort.__version__}; "
          f"cores (host, compute): {cores or 'shared'}")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="kiln-bench-model-") as tmp:
        model = spec.build.write(Path(tmp) / f"{spec.name}.onnx")
        print(f"model {spec.name}: {spec.build.flops() / 1e6:.1f} MFLOPs per item, "
              f"input {spec.input} {spec.datatype} {spec.shape}")  # fmt: skip
        sizes = sorted({1, 2, 4, 8, 16, 32, 64, args.max_batch_size})
        before = {b: direct_best(spec, model, b, args.duration / 2, compute) for b in sizes}
        batched = measure_kiln(spec, model, args, args.max_batch_size)
        print(f"kiln max_batch_size={args.max_batch_size}:", json.dumps(batched))
        unbatched = None if args.throughput_only else measure_kiln(spec, model, args, 1)
        print("kiln max_batch_size=1:", json.dumps(unbatched))
        # Direct runs before and after Kiln; the better of the two counts (the stricter ratio).
        batches = {
            b: max(before[b], direct_best(spec, model, b, args.duration / 2, compute))
            for b in sizes
        }
        best = max(batches, key=lambda b: batches[b])
        print("direct:", {b: round(v) for b, v in batches.items()}, f"best batch {best}")
        if not args.throughput_only:
            starts = measure_starts(spec, model, 3)
            print("worker starts:", json.dumps(starts))
            int8 = measure_int8(spec, model, args.duration / 2, threads)
            print("int8:", json.dumps(int8))
    loaded, single = batched["loaded"], batched["single"]
    bound = 2 * (single["p50_ms"] + args.max_queue_delay_ms)
    print(f"load after: {os.getloadavg()}")
    print(f"kiln/direct-best throughput: {loaded['per_s'] / batches[best]:.3f} (target >= 0.85)")
    floor = args.concurrency * args.items / batches[best] * 1000
    print(f"p99 {loaded['p99_ms']:.1f} ms vs 2 x (single {single['p50_ms']:.2f} ms + "
          f"{args.max_queue_delay_ms} ms) = {bound:.1f} ms; mean latency at the in-process "
          f"best rate (Little's law) {floor:.1f} ms")  # fmt: skip
    if args.throughput_only:
        return
    assert unbatched is not None
    print(f"batching speedup: {loaded['per_s'] / unbatched['loaded']['per_s']:.2f}x")
    for mode in ("process", "standby"):
        s = starts[mode]
        print(f"worker start, {mode} (median of {starts['repeats']}): first (compile) "
              f"{s['cold_start_s']:.3f} s (load {s['cold_load_s']:.3f} s), second (cached) "
              f"{s['warm_start_s']:.3f} s (load {s['warm_load_s']:.3f} s): "
              f"{s['cold_start_s'] / s['warm_start_s']:.1f}x faster (target >= 3x)")  # fmt: skip
    print(
        f"int8 engine: {int8['int8_engine_per_s'] / int8['fp32_engine_per_s']:.2f}x fp32 "
        f"throughput, cosine {int8['cosine']:.6f}, max abs diff {int8['max_abs_diff']:.4f}"
    )


if __name__ == "__main__":
    main()
