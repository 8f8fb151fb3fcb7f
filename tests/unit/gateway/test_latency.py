"""p50 / p99 per version from the request-duration histogram's buckets."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry

from kiln_platform.gateway.latency import by_version, quantile
from kiln_platform.gateway.metrics import RequestMetrics

pytestmark = pytest.mark.unit


def test_a_quantile_is_the_upper_bound_of_its_bucket() -> None:
    buckets = [(0.01, 50.0), (0.1, 98.0), (1.0, 100.0), (math.inf, 100.0)]
    assert quantile(buckets, 0.5) == 0.01
    assert quantile(buckets, 0.99) == 1.0


def test_versions_are_summed_over_tenants_and_endpoints() -> None:
    metrics = RequestMetrics(tenant_labels=True, registry=CollectorRegistry())
    for tenant, seconds in (("a", 0.004), ("b", 0.004), ("a", 0.2)):
        metrics.finished(("m", "1", tenant), "embeddings", seconds, 200, None)
    metrics.finished(("m", "2", "a"), "embeddings", 3.0, 200, None)
    found = by_version(metrics.duration)
    assert found.keys() == {"m@1", "m@2"}
    assert (found["m@1"].requests, found["m@1"].p50, found["m@1"].p99) == (3, 0.005, 0.25)
    assert found["m@2"].p50 == 5.0
