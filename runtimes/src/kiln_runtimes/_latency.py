"""Batch execution time as ``t(n) = a*n + b``, learned online (after BentoML's dispatcher)."""

from __future__ import annotations

from collections import deque


class LatencyModel:
    """Least squares over the last ``window`` (n, seconds) observations, from a prior.

    With a single distinct batch size in the window the slope cannot be fitted, so the last slope
    is kept and only the intercept follows the data. Both coefficients stay non-negative.
    """

    def __init__(self, a: float = 0.002, b: float = 0.005, window: int = 64) -> None:
        self.a = a
        self.b = b
        self._samples: deque[tuple[int, float]] = deque(maxlen=window)

    def predict(self, n: int) -> float:
        """Predicted seconds to run a batch of ``n`` items."""
        return self.a * n + self.b

    def observe(self, n: int, seconds: float) -> None:
        """Add one executed batch and refit."""
        self._samples.append((n, seconds))
        count = len(self._samples)
        n_mean = sum(x for x, _ in self._samples) / count
        t_mean = sum(t for _, t in self._samples) / count
        sxx = sum((x - n_mean) ** 2 for x, _ in self._samples)
        if sxx > 0:
            sxy = sum((x - n_mean) * (t - t_mean) for x, t in self._samples)
            self.a = max(sxy / sxx, 0.0)
        self.b = t_mean - self.a * n_mean
        if self.b < 0:
            self.b = 0.0
            self.a = sum(x * t for x, t in self._samples) / sum(x * x for x, _ in self._samples)
