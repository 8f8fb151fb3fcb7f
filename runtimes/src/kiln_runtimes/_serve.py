"""Serving one model: listen at once, load, serve until SIGTERM/SIGINT, drain, exit."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

import msgspec
import structlog
from aiohttp import web

from kiln_runtimes._app import create_app, metrics_app
from kiln_runtimes._runtime import Worker
from kiln_runtimes.protocol import MANIFEST_NAME, ModelManifest

if TYPE_CHECKING:
    from kiln_runtimes._settings import WorkerSettings

log = structlog.get_logger(__name__)


def run(main: Coroutine[Any, Any, int]) -> int:
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
    orphaned = _watch_parent(worker, stop) if settings.exit_with_parent else None
    await stop.wait()
    if orphaned is not None:
        orphaned.cancel()
    log.info("draining", in_flight=worker.in_flight, queued=worker.queued())
    await worker.drain()
    for runner in runners:
        await runner.cleanup()
    await worker.close()
    log.info("stopped")
    return 0


def _watch_parent(worker: Worker, stop: asyncio.Event) -> asyncio.Task[None]:
    """Stop (drain, exit) once the process that started this one is gone (re-parented)."""
    parent = os.getppid()

    async def watch() -> None:
        while True:
            await asyncio.sleep(0.5)
            if os.getppid() != parent:
                break
        log.warning("parent process gone; stopping", parent=parent)
        worker.begin_drain()
        stop.set()

    return asyncio.create_task(watch(), name="parent-watch")


def _on_signal(worker: Worker, stop: asyncio.Event, signum: int) -> None:
    log.info("signal received", signal=signal.Signals(signum).name)
    worker.begin_drain()
    stop.set()
