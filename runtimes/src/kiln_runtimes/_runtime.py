"""One served model: its settings, phase, in-flight requests and the engine behind them."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Literal

import structlog

from kiln_runtimes import _tensor, backends, cpus
from kiln_runtimes._errors import Busy, Draining, NotReady
from kiln_runtimes._metrics import WorkerMetrics
from kiln_runtimes.backends import create_backend
from kiln_runtimes.backends.base import StreamBackend
from kiln_runtimes.batcher import Batcher
from kiln_runtimes.protocol import ModelManifest, WorkerInfo

if TYPE_CHECKING:
    from kiln_runtimes._settings import WorkerSettings
    from kiln_runtimes.backends.base import EngineBackend

Phase = Literal["loading", "ready", "draining"]
log = structlog.get_logger(__name__)


class Worker:
    """Loading -> ready -> draining; requests are admitted only while ready."""

    def __init__(self, settings: WorkerSettings, manifest: ModelManifest) -> None:
        self.settings, self.manifest = settings, manifest
        self.metrics = WorkerMetrics()
        self.phase: Phase = "loading"
        self.in_flight = 0
        self.peak_in_flight = 0
        self.load_s = self.warmup_s = 0.0
        """How long the model's load (a tensor model's compile included) and warm-up took."""
        self._idle = asyncio.Event()
        self._idle.set()
        self._engine: EngineBackend | None = None
        self._batcher: Batcher | None = None
        """Embeddings and tensors: the batches the engine runs."""
        self._streams: StreamBackend | None = None
        """Generation: the engine batches its sequences itself."""
        self.metrics.in_flight.set_function(lambda: self.in_flight)
        self.metrics.queued.set_function(self.queued)
        self.metrics.ready.set_function(lambda: self.phase == "ready")
        self.metrics.slots.set(settings.slots)
        self.metrics.peak_in_flight.set_function(lambda: self.peak_in_flight)

    @property
    def batcher(self) -> Batcher:
        """The batcher of a batch engine (exists once loaded)."""
        if self._batcher is None:
            raise NotReady("model is not loaded")
        return self._batcher

    @property
    def generator(self) -> StreamBackend:
        """The streaming engine (exists once loaded)."""
        if self._streams is None:
            raise NotReady("model is not loaded")
        return self._streams

    async def load(self) -> None:
        """Load and warm the engine, then become ready unless draining began meanwhile."""
        settings, manifest = self.settings, self.manifest
        cpus.keep_off(settings.cpus)  # the engine's threads go on --cpus; the loop elsewhere
        start = time.perf_counter()
        model_dir, served, optimized = settings.model_dir, manifest, False
        if manifest.task == "tensor":
            model_dir, served, optimized = await _tensor.engine_folder(
                settings, manifest, self.metrics
            )
        engine = create_backend(manifest, settings.engine_options(optimized))
        self.warmup_s = await backends.start(engine, model_dir, served, settings.cpus)
        self._engine = engine
        if isinstance(engine, StreamBackend):
            self._streams = engine
            self._watch(engine)
        else:  # a tensor model's manifest says whether it batches; embeddings always do
            batching = manifest.batching or manifest.task != "tensor"
            self._batcher = Batcher(
                engine.run,
                settings.batch_policy(batching),
                stopper=engine.stop_handle,
                on_batch=self.metrics.observe_batch,
                cpus=settings.cpus,
            )
            self._batcher.start()
        total = time.perf_counter() - start
        self.load_s = total - self.warmup_s
        self.metrics.load_seconds.set(total)
        if self.phase == "loading":
            self.phase = "ready"
        log.info("model loaded", model=manifest.name, task=manifest.task, phase=self.phase)

    def _watch(self, engine: StreamBackend) -> None:
        """Expose a streaming engine's sequences (and adapters) in the metrics."""
        self.metrics.watch_generation(
            lambda: engine.health().running, lambda: engine.health().waiting
        )
        if engine.health().prefix_cache is not None:
            self.metrics.watch_prefix_cache(lambda: engine.health().prefix_cache)
        if self.settings.adapter_slots:
            self.metrics.watch_adapters(
                lambda: engine.health().adapters_in_slots,
                lambda: engine.health().adapters_in_memory,
            )

    @contextlib.contextmanager
    def admit(self) -> Iterator[None]:
        """Count a request in flight for its whole handling, or refuse it."""
        if self.phase == "draining":
            raise Draining("worker is draining")
        if self.phase == "loading":
            raise NotReady("model is loading")
        if self.settings.slots and self.in_flight >= self.settings.slots:
            raise Busy(f"all {self.settings.slots} slots are taken")
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        self._idle.clear()
        try:
            yield
        finally:
            self.in_flight -= 1
            if self.in_flight == 0:
                self._idle.set()

    def begin_drain(self) -> None:
        """Refuse new requests from now on; health reports draining."""
        self.phase = "draining"

    async def drain(self) -> None:
        """Refuse new requests and wait until every admitted one has been answered."""
        self.begin_drain()
        await self._idle.wait()

    async def close(self) -> None:
        """Stop the batcher and unload the engine."""
        if self._batcher is not None:
            await self._batcher.close()
        if self._engine is not None:
            await asyncio.to_thread(self._engine.unload)

    def queued(self) -> int:
        """Inputs queued in the batcher, or sequences waiting in the engine."""
        if self._batcher is not None:
            return self._batcher.queue.queued
        return self._streams.health().waiting if self._streams is not None else 0

    def info(self) -> WorkerInfo:
        """Describe this worker; ``ready`` is what ``/health`` answers."""
        settings, queued = self.settings, self.queued()
        if self._streams is not None:
            free = settings.max_batch_size - self._streams.health().running - queued
        else:
            free = settings.max_queue - queued
        return WorkerInfo(
            model=settings.model or self.manifest.name,
            version=settings.version,
            task=self.manifest.task,
            ready=self.phase == "ready",
            draining=self.phase == "draining",
            in_flight=self.in_flight,
            queued=queued,
            free_slots=max(free, 0),
            max_batch_size=settings.max_batch_size,
            max_queue=0 if self._streams is not None else settings.max_queue,
            load_s=self.load_s,
            warmup_s=self.warmup_s,
        )
