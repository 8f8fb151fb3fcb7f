"""A gateway's running comparison of one (model, candidate): counts, agreement, latencies."""

from __future__ import annotations

import math
from collections import Counter, deque

import numpy as np

from kiln_platform.shadow.policy import Agreement, Drop
from kiln_platform.shadow.schemas import ShadowReport

WINDOW = 2048
"""Latencies kept per side for the percentiles (the newest)."""


def _pct(values: deque[float], q: float) -> float | None:
    return round(float(np.percentile(np.fromiter(values, float), q)) * 1000, 3) if values else None


class ShadowStats:
    """What a gateway has seen of one candidate since it started (in memory)."""

    def __init__(self, model: str, candidate: str) -> None:
        self.model, self.candidate = model, candidate
        self.mirrored = self.failed = self.not_comparable = self.compared = self.agreed = 0
        self.dropped: Counter[str] = Counter()
        self._cosine_sum, self._cosine_n, self._cosine_min = 0.0, 0, math.inf
        self._max_diff: float | None = None
        self._primary: deque[float] = deque(maxlen=WINDOW)
        self._shadow: deque[float] = deque(maxlen=WINDOW)
        self.changed = False
        """Anything new since the report was last persisted."""

    def drop(self, reason: Drop) -> None:
        """A copy was not sent."""
        self.dropped[reason.value] += 1
        self.changed = True

    def skip(self) -> None:
        """A request's answer could not be compared (sampled generation): not copied."""
        self.not_comparable += 1
        self.changed = True

    def sent(self) -> None:
        """A copy went to the candidate."""
        self.mirrored += 1
        self.changed = True

    def fail(self) -> None:
        """The candidate answered a copy with an error."""
        self.failed += 1
        self.changed = True

    def record(self, found: Agreement, primary_s: float, shadow_s: float) -> None:
        """A copy answered: its comparison and both latencies."""
        self.compared += 1
        self.agreed += found.agrees
        if found.cosine_mean is not None and found.cosine_min is not None:
            self._cosine_sum += found.cosine_mean
            self._cosine_n += 1
            self._cosine_min = min(self._cosine_min, found.cosine_min)
        if found.max_abs_diff is not None:
            self._max_diff = max(self._max_diff or 0.0, found.max_abs_diff)
        self._primary.append(primary_s)
        self._shadow.append(shadow_s)
        self.changed = True

    def report(self, gateway: str) -> ShadowReport:
        """The figures so far."""
        return ShadowReport(
            model=self.model, candidate=self.candidate, gateway=gateway,
            mirrored=self.mirrored, dropped=dict(self.dropped), failed=self.failed,
            not_comparable=self.not_comparable, compared=self.compared,
            agreement=self.agreed / self.compared if self.compared else None,
            cosine_mean=self._cosine_sum / self._cosine_n if self._cosine_n else None,
            cosine_min=self._cosine_min if self._cosine_n else None,
            max_abs_diff=self._max_diff,
            primary_p50_ms=_pct(self._primary, 50), primary_p99_ms=_pct(self._primary, 99),
            shadow_p50_ms=_pct(self._shadow, 50), shadow_p99_ms=_pct(self._shadow, 99),
            shadow_error_rate=self.failed / self.mirrored if self.mirrored else None,
        )  # fmt: skip
