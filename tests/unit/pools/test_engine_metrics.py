"""The workers' key series summed per pool: counters and histograms add up across workers,
utilization ratios average, other series stay on the workers."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric

from kiln_platform.pools.engine_metrics import aggregate
from kiln_runtimes._metrics import WorkerMetrics

pytestmark = pytest.mark.unit


def _worker(requests: int, batch: int) -> str:
    metrics = WorkerMetrics()
    metrics.requests.labels("/v1/embed", "ok").inc(requests)
    metrics.batch_size.observe(batch)
    metrics.load_seconds.set(3.0)
    return metrics.render().decode()


class _Registry:
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


def test_two_workers_of_a_pool_add_up_and_pools_stay_apart() -> None:
    families = aggregate([
        ("minilm", "v1", _worker(3, 4)), ("minilm", "v1", _worker(5, 16)),
        ("minilm", "v2", _worker(7, 1)),
    ])  # fmt: skip
    registry = CollectorRegistry()
    registry.register(_Registry(families))

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    ok = {"endpoint": "/v1/embed", "outcome": "ok"}
    assert value("kiln_pool_engine_requests_total", model="minilm", version="v1", **ok) == 8
    assert value("kiln_pool_engine_requests_total", model="minilm", version="v2", **ok) == 7
    v1 = {"model": "minilm", "version": "v1"}
    assert value("kiln_pool_engine_batch_size_count", **v1) == 2
    assert value("kiln_pool_engine_batch_size_bucket", le="4.0", **v1) == 1
    assert value("kiln_pool_engine_batch_size_sum", **v1) == 20
    text = generate_latest(registry).decode()
    assert "load_seconds" not in text  # not a key series
    assert "_created" not in text


def test_ratios_are_averaged() -> None:
    line = 'kiln_worker_gpu_utilization_ratio{{gpu="0"}} {}\n'
    text = "# TYPE kiln_worker_gpu_utilization_ratio gauge\n" + line
    (family,) = aggregate([("llm", "v1", text.format(0.2)), ("llm", "v1", text.format(0.6))])
    (sample,) = family.samples
    assert sample.value == pytest.approx(0.4)
