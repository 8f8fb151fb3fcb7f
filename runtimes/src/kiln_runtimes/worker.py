"""The runtime worker process: one model behind the HTTP endpoints documented in ``protocol``.

The server listens at once (``/health`` answers 503 while loading), becomes ready after load and
warmup, and on SIGTERM/SIGINT drains: it refuses new work, finishes what it admitted, exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import signal
import sys
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any

import msgspec
import structlog
from aiohttp import web

from kiln_runtimes import _standby, cpus
from kiln_runtimes._app import create_app, metrics_app
from kiln_runtimes._logging import configure_logging
from kiln_runtimes._runtime import Worker
from kiln_runtimes._settings import WorkerSettings
from kiln_runtimes.protocol import MANIFEST_NAME, WORKER_SECRET_ENV, ModelManifest

log = structlog.get_logger(__name__)


def parse_args(argv: Sequence[str] | None = None) -> WorkerSettings:
    """Read the command line into settings."""
    parser = argparse.ArgumentParser(prog="kiln-worker", description=__doc__)
    parser.add_argument(
        "--model-dir",
        type=Path,
        required=True,
        help=f"folder with {MANIFEST_NAME} and the model files it names",
    )
    parser.add_argument("--model", help="served model name (default: the manifest's)")
    parser.add_argument("--version", default="0", help="served model version")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (logged)")
    parser.add_argument(
        "--metrics-port", type=int, default=0,
        help="also serve GET /metrics, without the worker secret, on this port (0: not at all)",
    )  # fmt: skip
    parser.add_argument(
        "--max-batch-size",
        type=int,
        default=32,
        help="items per batch (embeddings) or concurrent sequences (generation)",
    )
    parser.add_argument(
        "--max-wait-ms",
        type=float,
        default=5.0,
        help="longest time the oldest queued item waits for a batch to fill",
    )
    parser.add_argument(
        "--threads", type=int,
        help="engine intra-op threads (default: one per --cpus core, else one per core)",
    )  # fmt: skip
    parser.add_argument(
        "--concurrency",
        type=int,
        default=1,
        help="batches run at once, each on --threads engine threads (embeddings, tensors)",
    )
    parser.add_argument(
        "--prefetch",
        action="store_true",
        help="close a full batch while every runner is busy (one per runner), so a runner "
        "starts its next batch without waiting for the event loop",
    )
    parser.add_argument(
        "--cpus",
        type=cpus.parse,
        help="cores for the engine's threads, e.g. 1 or 2-7; the event loop keeps off them",
    )
    parser.add_argument(
        "--no-preempt",
        dest="preempt",
        action="store_false",
        help="express requests wait for the running batch instead of stopping it",
    )
    parser.add_argument(
        "--max-queue",
        type=int,
        default=1024,
        help="queued inputs (or waiting sequences) beyond which requests get 429",
    )
    parser.add_argument(
        "--adapter-slots", type=int, default=0,
        help="LoRA adapters a generation worker holds at once, loaded on demand (0: none)",
    )  # fmt: skip
    parser.add_argument(
        "--adapter-rank", type=int, default=16,
        help="columns of one adapter slot; an adapter's q, k and v ranks add up in it",
    )  # fmt: skip
    parser.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"]
    )
    parser.add_argument("--target", default="cpu", help="engine target (tensor models)")
    parser.add_argument(
        "--precision", default="fp32", help="engine precision (tensor models): fp32, int8, fp16"
    )
    args = parser.parse_args(argv)
    cores = set(range(os.cpu_count() or 1))
    if args.cpus is not None and not args.cpus <= cores:
        parser.error(f"--cpus: this machine has no cores {sorted(args.cpus - cores)}")
    for name in ("max_batch_size", "threads", "max_queue", "concurrency", "adapter_rank"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    return WorkerSettings(
        model_dir=args.model_dir,
        model=args.model,
        version=args.version,
        host=args.host,
        port=args.port,
        metrics_port=args.metrics_port,
        max_batch_size=args.max_batch_size,
        max_wait=args.max_wait_ms / 1000,
        threads=args.threads,
        concurrency=args.concurrency,
        preempt=args.preempt,
        prefetch=args.prefetch,
        cpus=args.cpus,
        max_queue=args.max_queue,
        log_level=args.log_level,
        target=args.target,
        precision=args.precision,
        adapter_slots=max(0, args.adapter_slots),
        adapter_rank=args.adapter_rank,
    )


def main(argv: Sequence[str] | None = None) -> None:
    """Run a worker until it is told to stop; the exit status says how it ended.

    ``--standby`` as the only argument: preload, then take the arguments from stdin (``_standby``).
    The secret the gateway's calls carry comes from ``$KILN_WORKER_SECRET``, which is then taken
    out of the environment (nothing this process starts inherits it).
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if args == ["--standby"]:
        _standby.preload()
        args = _standby.assignment()
    secret = os.environ.pop(WORKER_SECRET_ENV, "")
    if not secret:
        raise SystemExit(f"kiln-worker: ${WORKER_SECRET_ENV} is not set (the gateway's secret)")
    settings = dataclasses.replace(parse_args(args), secret=secret)
    configure_logging(settings.log_level)
    raise SystemExit(_run(serve(settings)))


def _run(main: Coroutine[Any, Any, int]) -> int:
    """Run on uvloop where it is installed: its C event loop spends less of the cores that the
    batches need on sockets and wakeups."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - Windows
        return asyncio.run(main)
    return uvloop.run(main)


async def serve(settings: WorkerSettings) -> int:
    """Listen, load, serve until SIGTERM/SIGINT, drain; return the exit status."""
    try:
        manifest_bytes = (settings.model_dir / MANIFEST_NAME).read_bytes()
        manifest = msgspec.json.decode(manifest_bytes, type=ModelManifest)
    except (OSError, msgspec.DecodeError):
        log.exception("cannot read the model manifest", model_dir=str(settings.model_dir))
        return 1
    worker = Worker(settings, manifest)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, _on_signal, worker, stop, signum)
    runners = [web.AppRunner(create_app(worker), access_log=None)]
    ports = [settings.port]
    if settings.metrics_port:
        runners.append(web.AppRunner(metrics_app(worker), access_log=None))
        ports.append(settings.metrics_port)
    for runner, port in zip(runners, ports, strict=True):
        await runner.setup()
        await web.TCPSite(runner, settings.host, port).start()
    log.info(
        "listening",
        addresses=[list(a) for r in runners for a in r.addresses],
        model=manifest.name,
        version=settings.version,
        task=manifest.task,
    )
    try:
        await worker.load()
    except Exception:
        log.exception("model failed to load")
        for runner in runners:
            await runner.cleanup()
        return 1
    await stop.wait()
    log.info("draining", in_flight=worker.in_flight, queued=worker.queued())
    await worker.drain()
    for runner in runners:
        await runner.cleanup()
    await worker.close()
    log.info("stopped")
    return 0


def _on_signal(worker: Worker, stop: asyncio.Event, signum: int) -> None:
    log.info("signal received", signal=signal.Signals(signum).name)
    worker.begin_drain()
    stop.set()
