"""The workers' engine series, summed per pool on the gateway's ``/metrics``.

Prometheus can scrape every worker (``--metrics-port``), but then has to find them; this gives
the few series an operator reads first per ``model``/``version`` from the gateway alone, renamed
``kiln_worker_*`` -> ``kiln_pool_engine_*``: counters, histograms and sizes summed over the
pool's ready workers, ``*_ratio`` gauges (GPU utilization) averaged.

It stays cheap: a scrape returns the last snapshot and, when that is older than ``ttl_s``,
starts one refresh in the background, which asks each ready worker for ``/metrics`` with a
``timeout_s`` (a worker that does not answer is left out of that snapshot).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import defaultdict
from typing import TYPE_CHECKING

import aiohttp
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    from kiln_platform.pools.backend import PoolBackend

KEY_SERIES = frozenset({
    "kiln_worker_requests", "kiln_worker_batch_size", "kiln_worker_queue_wait_seconds",
    "kiln_worker_compute_seconds", "kiln_worker_preempted_batches", "kiln_worker_in_flight",
    "kiln_worker_queued", "kiln_worker_running_sequences", "kiln_worker_waiting_sequences",
    "kiln_worker_gpu_utilization_ratio", "kiln_worker_gpu_memory_used_bytes",
})  # fmt: skip
_FROM, _TO = "kiln_worker_", "kiln_pool_engine_"

Scrape = tuple[str, str, str]
"""(model, version, a worker's text exposition)."""


def aggregate(scrapes: Iterable[Scrape]) -> list[Metric]:
    """The key series of every scrape, summed (``*_ratio``: averaged) per model and version."""
    families: dict[str, Metric] = {}
    sums: defaultdict[str, defaultdict[tuple[str, tuple[tuple[str, str], ...]], list[float]]]
    sums = defaultdict(lambda: defaultdict(list))
    for model, version, text in scrapes:
        for family in text_string_to_metric_families(text):
            if family.name not in KEY_SERIES:
                continue
            name = _TO + family.name.removeprefix(_FROM)
            families.setdefault(name, Metric(name, family.documentation, family.type))
            for sample in family.samples:
                if sample.name.endswith("_created"):
                    continue
                labels = {**sample.labels, "model": model, "version": version}
                key = (_TO + sample.name.removeprefix(_FROM), tuple(sorted(labels.items())))
                sums[name][key].append(sample.value)
    for name, samples in sums.items():
        average = name.endswith("_ratio")
        for (sample_name, pairs), values in sorted(samples.items()):
            value = sum(values) / len(values) if average else sum(values)
            families[name].add_sample(sample_name, dict(pairs), value)
    return list(families.values())


class EngineMetrics:
    """A collector over the pools' ready workers (registered by the app's composition root)."""

    def __init__(
        self,
        backend: PoolBackend,
        http: aiohttp.ClientSession,
        ttl_s: float = 5.0,
        timeout_s: float = 1.0,
    ) -> None:
        self._backend = backend
        self._http = http
        self._ttl_s, self._timeout_s = ttl_s, timeout_s
        self._families: list[Metric] = []
        self._at = -float("inf")
        self._task: asyncio.Task[None] | None = None

    def describe(self) -> list[Metric]:
        """Nothing to declare ahead (so registering does not scrape the workers)."""
        return []

    def collect(self) -> Iterator[Metric]:
        """The last snapshot; a stale one starts a refresh for the next scrape."""
        if time.monotonic() - self._at >= self._ttl_s and (self._task is None or self._task.done()):
            with contextlib.suppress(RuntimeError):  # no loop here: a snapshot as it is
                self._task = asyncio.get_running_loop().create_task(self.refresh())
        yield from self._families

    async def refresh(self) -> None:
        """Ask every ready worker for its series, at once, each within the timeout."""
        workers = [w for key in list(self._backend.pools) for w in self._backend.ready(key)]
        texts = await asyncio.gather(*(self._fetch(w.url) for w in workers))
        self._families = aggregate(
            (w.spec.model, w.spec.version, text)
            for w, text in zip(workers, texts, strict=True)
            if text is not None
        )
        self._at = time.monotonic()

    async def _fetch(self, url: str) -> str | None:
        timeout = aiohttp.ClientTimeout(total=self._timeout_s)
        with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
            async with self._http.get(f"{url}/metrics", timeout=timeout) as response:
                if response.status == 200:
                    return await response.text()
        return None

    async def close(self) -> None:
        """Wait for a refresh in progress (on shutdown)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
