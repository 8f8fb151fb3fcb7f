"""p50 / p99 request latency per served version, read from this gateway's own
``kiln_model_request_duration_seconds`` histogram (no query, no scan: the console's models page).

A quantile is the upper bound of the bucket it falls in (what ``histogram_quantile`` would
interpolate within), so the figure is an upper estimate since the gateway started.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable

    from prometheus_client import Histogram


@dataclass(frozen=True, slots=True)
class Latency:
    """One version's requests since the gateway started, and their p50 / p99 in seconds."""

    requests: int
    p50: float
    p99: float


def quantile(buckets: list[tuple[float, float]], q: float) -> float:
    """The upper bound of the bucket holding quantile ``q`` of cumulative ``(le, count)``."""
    total = buckets[-1][1]
    for le, count in buckets:
        if count >= q * total:
            return le
    return math.inf


def by_version(histogram: Histogram) -> dict[str, Latency]:
    """Each ``model@version``'s latency, over every tenant and endpoint."""
    return summarize(
        (s.labels, s.value)
        for metric in histogram.collect()
        for s in metric.samples
        if s.name.endswith("_bucket")
    )


def summarize(samples: Iterable[tuple[dict[str, str], float]]) -> dict[str, Latency]:
    """Bucket samples (labels with ``model``, ``version``, ``le``) summed per version."""
    counts: dict[str, dict[float, float]] = defaultdict(lambda: defaultdict(float))
    for labels, value in samples:
        counts[f"{labels['model']}@{labels['version']}"][float(labels["le"])] += value
    found = {}
    for key, per_le in counts.items():
        buckets = sorted(per_le.items())
        if buckets and buckets[-1][1] > 0:
            found[key] = Latency(
                int(buckets[-1][1]), quantile(buckets, 0.5), quantile(buckets, 0.99)
            )
    return found
