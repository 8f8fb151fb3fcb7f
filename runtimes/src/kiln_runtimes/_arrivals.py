"""Whether a batch should wait for company: the arrival rate, and the pure decision on it.

A batch that waits ``g`` seconds for one more request delays the ``n`` items it holds by ``g``
plus one item's time ``a``, and saves the newcomer the batch it would otherwise wait behind and
one run's fixed cost ``b`` (``t(n) = a*n + b``, ``_latency.LatencyModel``). Waiting pays only
when ``b - g > n * (g + a)``; on a CPU, where a batch costs about the sum of its items, it almost
never does, and a lone request runs at once (``BatchQueue`` closes it as ``alone``).
"""

from __future__ import annotations

from dataclasses import dataclass

from kiln_runtimes._latency import LatencyModel


@dataclass(slots=True)
class ArrivalRate:
    """An EWMA of the gaps between request arrivals (``weight`` on the newest gap)."""

    weight: float = 0.2
    gap: float | None = None
    """The smoothed gap in seconds; ``None`` until two requests arrived."""
    last: float | None = None
    """When the last request arrived."""

    def observe(self, now: float) -> None:
        """Record one arrival at ``now``."""
        if self.last is not None:
            seen = max(now - self.last, 0.0)
            self.gap = seen if self.gap is None else self.gap + self.weight * (seen - self.gap)
        self.last = now

    def expected_gap(self, now: float) -> float | None:
        """Seconds from ``now`` until the next arrival is expected: the smoothed gap (arrivals
        are taken as memoryless), or the time already passed since the last arrival if that is
        longer (a rate that has dropped shows there first). ``None``: nothing known yet."""
        if self.gap is None or self.last is None:
            return None
        return max(self.gap, now - self.last)


def worth_waiting(
    model: LatencyModel, *, size: int, waited: float, budget: float, gap: float | None
) -> bool:
    """Whether a batch of ``size`` items, its oldest ``waited`` seconds old, should wait for the
    next arrival, expected ``gap`` seconds from now (``None``: unknown, wait as before), within
    ``budget`` seconds of waiting in all."""
    if gap is None:
        return True
    if gap > budget - waited:
        return False
    return model.b - gap > size * (gap + model.a)
