"""One served model: its settings, phase, in-flight requests and the backend behind them."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Literal

import structlog

from kiln_runtimes import _tensor, cpus
from kiln_runtimes._errors import Draining, NotReady
from kiln_runtimes._metrics import WorkerMetrics
from kiln_runtimes._settings import WorkerSettings
from kiln_runtimes.backends import get_embedding_backend, get_generation_backend
from kiln_runtimes.batcher import Batcher
from kiln_runtimes.protocol import ModelManifest, WorkerInfo

if TYPE_CHECKING:
    from kiln_runtimes.backends.base import EmbeddingBackend, GenerationBackend, TensorBackend

Phase = Literal["loading", "ready", "draining"]
log = structlog.get_logger(__name__)


class Worker:
    """Loading -> ready -> draining; requests are admitted only while ready."""

    def __init__(self, settings: WorkerSettings, manifest: ModelManifest) -> None:
        self.settings, self.manifest = settings, manifest
        self.metrics = WorkerMetrics()
        self.phase: Phase = "loading"
        self.in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._embedder: EmbeddingBackend | None = None
        self._batcher: Batcher | None = None
        self._generator: GenerationBackend | None = None
        self._tensor: TensorBackend | None = None
        self.metrics.in_flight.set_function(lambda: self.in_flight)
        self.metrics.queued.set_function(self.queued)
        self.metrics.ready.set_function(lambda: self.phase == "ready")

    @property
    def batcher(self) -> Batcher:
        """The embeddings batcher (exists once loaded)."""
        if self._batcher is None:
            raise NotReady("model is not loaded")
        return self._batcher

    @property
    def generator(self) -> GenerationBackend:
        """The generation backend (exists once loaded)."""
        if self._generator is None:
            raise NotReady("model is not loaded")
        return self._generator

    async def load(self) -> None:
        """Load and warm the backend, then become ready unless draining began meanwhile."""
        settings, manifest = self.settings, self.manifest
        cpus.keep_off(settings.cpus)  # the engine's threads go on --cpus; the loop elsewhere
        if manifest.task == "embeddings":
            embedder = get_embedding_backend(manifest)
            on = settings.cpus
            threads = settings.engine_threads(os.cpu_count() or 1)
            await cpus.run_on(on, embedder.load, settings.model_dir, manifest, threads)
            await cpus.run_on(on, embedder.warmup)
            self._embedder = embedder
            self._batcher = Batcher(
                embedder.run,
                settings.batch_policy(),
                stopper=embedder.stopper,
                on_batch=self.metrics.observe_batch,
                cpus=on,
            )
            self._batcher.start()
        elif manifest.task == "generate":
            generator = get_generation_backend(
                manifest, threads=settings.engine_threads(0), cpus=settings.cpus,
                adapter_slots=settings.adapter_slots, adapter_rank=settings.adapter_rank,
            )  # fmt: skip
            await generator.load(settings.model_dir, manifest, settings.max_batch_size)
            self._generator = generator
            self.metrics.watch_generation(generator.running, generator.waiting)
            if settings.adapter_slots:
                self.metrics.watch_adapters(
                    lambda: generator.adapters()[0], lambda: generator.adapters()[1]
                )
        elif manifest.task == "tensor":
            self._tensor, self._batcher = await _tensor.load(settings, manifest, self.metrics)
        else:
            raise ValueError(f"task {manifest.task!r} is not served by this worker")
        if self.phase == "loading":
            self.phase = "ready"
        log.info("model loaded", model=manifest.name, task=manifest.task, phase=self.phase)

    @contextlib.contextmanager
    def admit(self) -> Iterator[None]:
        """Count a request in flight for its whole handling, or refuse it."""
        if self.phase == "draining":
            raise Draining("worker is draining")
        if self.phase == "loading":
            raise NotReady("model is loading")
        self.in_flight += 1
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
        """Stop the batcher and release the backend."""
        if self._batcher is not None:
            await self._batcher.close()
        if self._embedder is not None:
            self._embedder.unload()
        if self._tensor is not None:
            self._tensor.unload()
        if self._generator is not None:
            await self._generator.unload()

    def queued(self) -> int:
        """Embedding inputs queued, or generation sequences waiting."""
        if self._batcher is not None:
            return self._batcher.queue.queued
        return self._generator.waiting() if self._generator is not None else 0

    def info(self) -> WorkerInfo:
        """Describe this worker; ``ready`` is what ``/health`` answers."""
        settings, queued = self.settings, self.queued()
        if self._generator is not None:
            free = settings.max_batch_size - self._generator.running() - queued
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
            max_queue=0 if self._generator is not None else settings.max_queue,
        )
