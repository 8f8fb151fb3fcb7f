"""The gateway's SLI counters: every finished request judged against every SLO of its model.

The hot path only adds to a dict in memory (no I/O); ``SloMonitor`` moves the counts into
``slo_counts`` (one row per SLO and time bucket, added to by every gateway) each interval. The
same events feed the Prometheus series the generated rules (``kiln slo rules``) read:
``kiln_sli_requests_total{model,plan,code}`` and ``kiln_sli_latency_seconds{model,plan}``.
"""

from __future__ import annotations

import math
import uuid
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from prometheus_client import Counter, Histogram

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.25, 0.3, 0.5, 0.75, 1, 1.5, 2, 2.5, 3, 5,
                   7.5, 10, 15, 30, 60)  # fmt: skip
"""Bounds of ``kiln_sli_latency_seconds``: a generated rule counts a request fast when it falls
under the largest bound not above the SLO's threshold."""

REQUESTS = Counter(
    "kiln_sli_requests", "Requests that reached a model, by status class (2xx, 4xx, 5xx).",
    ["model", "plan", "code"],
)  # fmt: skip
LATENCY = Histogram(
    "kiln_sli_latency_seconds",
    "Request latency an SLO judges: time to first token for a generation, else the whole request.",
    ["model", "plan"], buckets=LATENCY_BUCKETS,
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Watched:
    """What the recorder needs of one SLO."""

    id: uuid.UUID
    model: str
    plan: str | None
    latency_ms: float


class SliRecorder:
    """Counts (total, errors, slow) per SLO and time bucket, in memory, until drained."""

    def __init__(self, bucket_s: float) -> None:
        self.bucket_s = bucket_s
        self._by_model: dict[str, list[Watched]] = {}
        self._counts: defaultdict[tuple[uuid.UUID, float], list[int]] = defaultdict(
            lambda: [0, 0, 0]
        )

    def watch(self, slos: Sequence[Watched]) -> None:
        """Replace the SLOs requests are judged against."""
        by_model: dict[str, list[Watched]] = {}
        for slo in slos:
            by_model.setdefault(slo.model, []).append(slo)
        self._by_model = by_model

    def observe(self, model: str, plan: str, status: int, latency_s: float, at: float) -> None:
        """One finished request (``at``: wall-clock seconds)."""
        REQUESTS.labels(model, plan, f"{status // 100}xx").inc()
        if 400 <= status < 500:  # the client's fault (or its going away): neither good nor bad
            return
        LATENCY.labels(model, plan).observe(latency_s)
        bucket = math.floor(at / self.bucket_s) * self.bucket_s
        for slo in self._by_model.get(model, ()):
            if slo.plan is not None and slo.plan != plan:
                continue
            counts = self._counts[slo.id, bucket]
            counts[0] += 1
            counts[1] += status >= 500
            counts[2] += latency_s * 1000 > slo.latency_ms

    def restore(self, counts: dict[tuple[uuid.UUID, float], list[int]]) -> None:
        """Put drained counts back (they could not be stored; the next interval retries)."""
        for key, (total, errors, slow) in counts.items():
            mine = self._counts[key]
            mine[0], mine[1], mine[2] = mine[0] + total, mine[1] + errors, mine[2] + slow

    def drain(self) -> dict[tuple[uuid.UUID, float], list[int]]:
        """The counts since the last drain (``(slo, bucket start) -> [total, errors, slow]``)."""
        counts, self._counts = self._counts, defaultdict(lambda: [0, 0, 0])
        return dict(counts)
