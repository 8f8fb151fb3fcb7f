"""Per-pool, per-tenant scheduler metrics, read from the schedulers at scrape time."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Protocol

from prometheus_client import REGISTRY
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

if TYPE_CHECKING:
    from collections.abc import Iterator

    from prometheus_client.core import Metric

    from kiln_platform.pools.backend import PoolBackend, PoolSize
    from kiln_platform.scheduler.runner import PoolRunner


class Pools(Protocol):
    """What the collector reads of the pool manager (``services.PoolManager``)."""

    runners: dict[str, PoolRunner]
    backend: PoolBackend

    def sizes(self) -> dict[str, PoolSize]: ...


class SchedulerCollector:
    """Admitted/rejected counts, service shares and Jain's index of every pool."""

    def __init__(self, pools: Pools) -> None:
        self._pools = pools

    def collect(self) -> Iterator[Metric]:
        """Build the metric families from each pool's stats snapshot."""
        pool, tenant = ["model", "version"], ["model", "version", "tenant"]
        admitted = CounterMetricFamily(
            "kiln_scheduler_admitted", "Requests admitted.", labels=tenant
        )
        rejected = CounterMetricFamily(
            "kiln_scheduler_rejected", "Requests rejected.", labels=[*tenant, "reason"]
        )
        share = GaugeMetricFamily(
            "kiln_scheduler_service_share",
            "Tenant's part of the cost served over the stats window.",
            labels=tenant,
        )
        jain = GaugeMetricFamily(
            "kiln_scheduler_fairness_index",
            "Jain's index of served vs weighted max-min fair share over the window.",
            labels=pool,
        )
        queued = GaugeMetricFamily(
            "kiln_scheduler_queued", "Requests waiting in the pool's fair queue.", labels=pool
        )
        in_flight = GaugeMetricFamily(
            "kiln_scheduler_in_flight", "Requests dispatched to the pool's workers.", labels=pool
        )
        now = time.monotonic()  # the event loop's clock, which the schedulers run on
        for key, runner in self._pools.runners.items():
            spec = self._pools.backend.specs[key]
            labels = [spec.model, spec.label]
            snapshot = runner.scheduler.snapshot(now)
            jain.add_metric(labels, snapshot.jain)
            queued.add_metric(labels, len(runner.scheduler.queue))
            in_flight.add_metric(labels, runner.scheduler.in_flight)
            for t in snapshot.tenants:
                admitted.add_metric([*labels, t.tenant], t.admitted)
                share.add_metric([*labels, t.tenant], t.share)
                for reason, count in t.rejected.items():
                    rejected.add_metric([*labels, t.tenant, reason], count)
        yield from (admitted, rejected, share, jain, queued, in_flight, self._replicas())

    def _replicas(self) -> GaugeMetricFamily:
        """Each pool's size (``PoolSize``)."""
        replicas = GaugeMetricFamily(
            "kiln_pool_replicas", "Workers of each pool, by state.",
            labels=["model", "version", "state"],
        )  # fmt: skip
        for size in self._pools.sizes().values():
            labels = [size.spec.model, size.spec.label]
            for state in ("desired", "running", "ready", "draining"):
                replicas.add_metric([*labels, state], getattr(size, state))
        return replicas


def register(pools: Pools) -> SchedulerCollector:
    """Export ``pools``' scheduler metrics from the default registry."""
    collector = SchedulerCollector(pools)
    REGISTRY.register(collector)
    return collector


def unregister(collector: SchedulerCollector) -> None:
    """Stop exporting (on shutdown, so a test process can start another app)."""
    REGISTRY.unregister(collector)
