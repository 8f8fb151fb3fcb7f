"""The runtime worker process: one model behind the HTTP endpoints documented in ``protocol``.

The server listens at once (``/health`` answers 503 while loading), becomes ready after load and
warmup, and on SIGTERM/SIGINT drains: it refuses new work, finishes what it admitted, exits 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kiln_runtimes import _serve, _standby, cpus, tracing
from kiln_runtimes._logging import configure_logging
from kiln_runtimes._settings import WorkerSettings
from kiln_runtimes.backends.base import DECODING_PREFILL, MIN_DECODING_PREFILL, PREFILL_CHUNK
from kiln_runtimes.protocol import MANIFEST_NAME, WORKER_SECRET_ENV
from kiln_runtimes.store import CACHE_MAX_ENV, STORE_ENV, open_store

_ARGUMENTS: tuple[tuple[tuple[str, ...], dict[str, Any]], ...] = (
    # the model and where it is served
    (("--model-dir",), {"type": Path, "required": True,
                        "help": f"folder with {MANIFEST_NAME} and the model files it names"}),
    (("--model",), {"help": "served model name (default: the manifest's)"}),
    (("--version",), {"default": "0", "help": "served model version"}),
    (("--host",), {"default": "127.0.0.1"}),
    (("--port",), {"type": int, "default": 0, "help": "0 picks a free port (logged)"}),
    (("--metrics-port",), {"type": int, "default": 0, "help": "also serve GET /metrics, "
                           "without the worker secret, on this port (0: not at all)"}),
    # batching
    (("--max-batch-size",), {"type": int, "default": 32, "help": "items per batch "
                             "(embeddings) or concurrent sequences (generation)"}),
    (("--max-wait-ms",), {"type": float, "default": 5.0, "help": "longest time the oldest "
                          "queued item waits for a batch to fill"}),
    (("--fixed-wait",), {"dest": "adaptive", "action": "store_false", "help": "every partial "
                         "batch waits --max-wait-ms, even when the arrival rate says no company "
                         "comes in time"}),
    (("--concurrency",), {"type": int, "default": 1, "help": "batches run at once, each on "
                          "--threads engine threads (embeddings, tensors)"}),
    (("--prefetch",), {"action": "store_true", "help": "close a full batch while every runner "
                       "is busy (one per runner), so a runner starts its next batch without "
                       "waiting for the event loop"}),
    (("--no-preempt",), {"dest": "preempt", "action": "store_false", "help": "express "
                         "requests wait for the running batch instead of stopping it"}),
    (("--no-express-runner",), {"dest": "express_lane", "action": "store_false", "help":
                                "express batches share the --concurrency runners instead of "
                                "starting at once on one of their own"}),
    (("--max-queue",), {"type": int, "default": 1024, "help": "queued inputs (or waiting "
                        "sequences) beyond which requests get 429"}),
    (("--slots",), {"type": int, "default": 0, "help": "requests admitted at once; more are "
                    "refused `busy` (retryable: the gateway leases them elsewhere); 0: no limit"}),
    (("--exit-with-parent",), {"action": "store_true", "help": "drain and exit when the "
                               "process that started this one dies"}),
    # the engine
    (("--threads",), {"type": int, "help": "engine intra-op threads (default: one per --cpus "
                      "core, else one per core)"}),
    (("--cpus",), {"type": cpus.parse, "help": "cores for the engine's threads, e.g. 1 or 2-7; "
                   "the event loop keeps off them"}),
    (("--adapter-slots",), {"type": int, "default": 0, "help": "LoRA adapters a generation "
                            "worker holds at once, loaded on demand (0: none)"}),
    (("--adapter-rank",), {"type": int, "default": 16, "help": "columns of one adapter slot; "
                           "an adapter's q, k and v ranks add up in it"}),
    (("--prefix-cache-mb",), {"type": int, "default": 256, "help": "memory for KV blocks of "
                              "prompt prefixes reused across a tenant's requests (0: none)"}),
    (("--decoding-prefill",), {"type": int, "default": DECODING_PREFILL, "help": "prompt "
                               "tokens a generation worker prefills per step while sequences "
                               f"decode ({MIN_DECODING_PREFILL} to {PREFILL_CHUNK}): smaller "
                               "keeps streams' token gaps even, larger gives new prompts "
                               "their first token sooner"}),
    (("--idle",), {"action": "store_true", "help": "run at idle CPU priority (SCHED_IDLE): a "
                   "background worker's, for batch lines and shadow copies, which then use "
                   "only the cores other work leaves idle"}),
    (("--log-level",), {"default": "info", "choices": ["debug", "info", "warning", "error"]}),
    (("--target",), {"default": "cpu", "help": "engine target (tensor models)"}),
    (("--precision",), {"default": "fp32", "help": "engine precision (tensor models): fp32, "
                        "int8, fp16"}),
)  # fmt: skip
"""The worker's flags, as ``argparse.add_argument`` calls (the help texts are ``--help``)."""
_AT_LEAST_ONE = (
    "max_batch_size", "threads", "max_queue", "concurrency", "adapter_rank",
)  # fmt: skip


def parse_args(argv: Sequence[str] | None = None) -> WorkerSettings:
    """Read the command line into settings."""
    parser = argparse.ArgumentParser(prog="kiln-worker", description=__doc__)
    for flags, options in _ARGUMENTS:
        parser.add_argument(*flags, **options)
    args = parser.parse_args(argv)
    cores = set(range(os.cpu_count() or 1))
    if args.cpus is not None and not args.cpus <= cores:
        parser.error(f"--cpus: this machine has no cores {sorted(args.cpus - cores)}")
    for name in _AT_LEAST_ONE:
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if not MIN_DECODING_PREFILL <= args.decoding_prefill <= PREFILL_CHUNK:
        parser.error(f"--decoding-prefill must be from {MIN_DECODING_PREFILL} to {PREFILL_CHUNK}")
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
        adaptive=args.adaptive,
        express_lane=args.express_lane,
        cpus=args.cpus,
        max_queue=args.max_queue,
        log_level=args.log_level,
        target=args.target,
        precision=args.precision,
        adapter_slots=max(0, args.adapter_slots),
        adapter_rank=args.adapter_rank,
        prefix_cache_mb=max(0, args.prefix_cache_mb),
        decoding_prefill=args.decoding_prefill,
        idle=args.idle,
        slots=max(0, args.slots),
        exit_with_parent=args.exit_with_parent,
    )


def materialize(model_dir: Path, environ: Mapping[str, str]) -> None:
    """With ``$KILN_ARTIFACT_STORE`` (``s3://...``), fetch the tree ``model_dir`` names
    (``<cache>/trees/<hex>``) from that store into the cache, verified by digest."""
    url = environ.get(STORE_ENV)
    if not url or model_dir.parent.name != "trees":
        return
    cap = int(environ.get(CACHE_MAX_ENV) or 0)
    open_store(model_dir.parent.parent, url, cap).ensure(f"sha256:{model_dir.name}")


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
    materialize(settings.model_dir, os.environ)
    if settings.idle:  # before the engine's threads start: they inherit it
        cpus.run_idle()
    configure_logging(settings.log_level)
    tracing.configure(os.environ, "kiln-worker")  # OTEL_*, passed on by the gateway
    try:
        status = _serve.run(_serve.serve(settings))
    finally:
        tracing.shutdown()  # exports what is buffered
    raise SystemExit(status)
