"""The worker's Prometheus metrics, kept in a registry of its own."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kiln_runtimes._batch_types import Outcome
from kiln_runtimes._nvml import gpu_collector
from kiln_runtimes.backends.base import PrefixStats

_SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class WorkerMetrics:
    """Requests by outcome, batch shape and timings, and gauges read at scrape time."""

    def __init__(self, nvml: object = None) -> None:
        self.registry = CollectorRegistry()
        registry = self.registry
        gpus = gpu_collector(nvml)
        if gpus is not None:  # a GPU and NVML: its utilization and memory
            registry.register(gpus)
        self.requests = Counter(
            "kiln_worker_requests",
            "Requests by endpoint and outcome.",
            ["endpoint", "outcome"],
            registry=registry,
        )
        self.batch_size = Histogram(
            "kiln_worker_batch_size",
            "Items per executed batch.",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
            registry=registry,
        )
        self.queue_wait = Histogram(
            "kiln_worker_queue_wait_seconds",
            "Arrival to first batch start, per request.",
            buckets=_SECONDS,
            registry=registry,
        )
        self.compute = Histogram(
            "kiln_worker_compute_seconds",
            "Backend execution time per batch.",
            buckets=_SECONDS,
            registry=registry,
        )
        self.preempted = Counter(
            "kiln_worker_preempted_batches",
            "Batches stopped for an express request (their items ran again later).",
            registry=registry,
        )
        self.preempted_seconds = Counter(
            "kiln_worker_preempted_compute_seconds",
            "Backend time thrown away by preempted batches.",
            registry=registry,
        )
        self._gauges(registry)
        self.engine_cache = Counter(
            "kiln_worker_engine_cache",
            "Compiled-engine lookups at load: hit, miss (compiled now) or uncached.",
            ["result"],
            registry=registry,
        )
        self.load_seconds = Gauge(
            "kiln_worker_load_seconds",
            "Seconds from load start to ready (engine, session, warmup).",
            registry=registry,
        )

    def _gauges(self, registry: CollectorRegistry) -> None:
        """The gauges the worker sets (or reads at scrape time): work in hand, its limit."""
        self.in_flight = Gauge(
            "kiln_worker_in_flight", "Requests being handled.", registry=registry
        )
        self.slots = Gauge(
            "kiln_worker_slots",
            "Requests the worker admits at once (--slots; 0: no limit); kiln_worker_in_flight "
            "is the slots in use.",
            registry=registry,
        )
        self.peak_in_flight = Gauge(
            "kiln_worker_in_flight_peak",
            "The most requests in flight at once since the worker started (never above "
            "kiln_worker_slots when that is set).",
            registry=registry,
        )
        self.queued = Gauge(
            "kiln_worker_queued", "Queued embedding inputs or waiting sequences.", registry=registry
        )
        self.ready = Gauge(
            "kiln_worker_ready", "1 while the worker accepts work.", registry=registry
        )

    def observe_batch(self, outcome: Outcome) -> None:
        """Record one executed (or preempted) batch."""
        if outcome.preempted:
            self.preempted.inc()
            self.preempted_seconds.inc(outcome.seconds)
            return
        self.batch_size.observe(len(outcome.batch.items))
        self.compute.observe(outcome.seconds)

    def watch_generation(self, running: Callable[[], float], waiting: Callable[[], float]) -> None:
        """Expose the generation backend's sequence counts."""
        Gauge(
            "kiln_worker_running_sequences", "Sequences being decoded.", registry=self.registry
        ).set_function(running)
        Gauge(
            "kiln_worker_waiting_sequences", "Sequences waiting to start.", registry=self.registry
        ).set_function(waiting)

    def watch_adapters(self, in_slots: Callable[[], float], read: Callable[[], float]) -> None:
        """Expose the LoRA adapters a generation worker holds."""
        Gauge(
            "kiln_worker_adapter_slots_used", "Adapter slots holding an adapter.",
            registry=self.registry,
        ).set_function(in_slots)  # fmt: skip
        Gauge(
            "kiln_worker_adapters_in_memory", "Adapters read from the store and kept in memory.",
            registry=self.registry,
        ).set_function(read)  # fmt: skip

    def watch_prefix_cache(self, stats: Callable[[], PrefixStats | None]) -> None:
        """Expose a generation worker's prefix cache: lookups by result, blocks and bytes held."""
        self.registry.register(_PrefixCollector(stats))

    def render(self) -> bytes:
        """Return the Prometheus text exposition."""
        return generate_latest(self.registry)


class _PrefixCollector(Collector):
    """The prefix cache's counts, read at scrape time."""

    def __init__(self, stats: Callable[[], PrefixStats | None]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        stats = self._stats()
        if stats is None:
            return
        lookups = CounterMetricFamily(
            "kiln_worker_prefix_cache_blocks",
            "Prompt blocks looked up in the prefix cache, by result (hit: its KV was reused).",
            labels=["result"],
        )
        lookups.add_metric(["hit"], stats.hit_blocks)
        lookups.add_metric(["miss"], stats.miss_blocks)
        yield lookups
        yield CounterMetricFamily(
            "kiln_worker_prefix_cache_evicted_blocks",
            "Blocks dropped from the prefix cache (least recently used) to stay in its bound.",
            value=stats.evicted_blocks,
        )
        for name, text, value in (
            ("held_blocks", "Blocks the prefix cache holds.", stats.blocks),
            ("bytes", "Bytes the prefix cache holds.", stats.bytes),
            ("max_bytes", "The prefix cache's bound (--prefix-cache-mb).", stats.max_bytes),
            ("block_tokens", "Prompt tokens in one prefix-cache block.", stats.block_tokens),
        ):
            yield GaugeMetricFamily(f"kiln_worker_prefix_cache_{name}", text, value=value)
