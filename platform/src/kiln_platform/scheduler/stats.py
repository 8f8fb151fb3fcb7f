"""Per-tenant accounting: service shares over a sliding window, Jain's index, wait percentiles."""

from __future__ import annotations

import math
from collections import Counter, defaultdict, deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kiln_platform.scheduler.schemas import Priority

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

    from kiln_platform.scheduler.schemas import Request


def percentile(samples: Sequence[float], q: float) -> float:
    """The nearest-rank ``q``-th percentile (0-100) of ``samples``; NaN when there are none."""
    if not samples:
        return math.nan
    ordered = sorted(samples)
    rank = math.ceil(q / 100 * len(ordered))
    return ordered[min(max(rank, 1), len(ordered)) - 1]


def jain_index(values: Iterable[float]) -> float:
    """Jain's fairness index ``(sum x)^2 / (n * sum x^2)``: 1 when all equal, 1/n at worst."""
    xs = list(values)
    square = sum(x * x for x in xs)
    return 1.0 if square == 0 else sum(xs) ** 2 / (len(xs) * square)


def max_min_fair(
    demand: Mapping[str, float], weights: Mapping[str, float], capacity: float
) -> dict[str, float]:
    """Weighted max-min fair split of ``capacity``: nobody gets more than it asked for."""
    fair = dict.fromkeys(demand, 0.0)
    open_ = {t for t, d in demand.items() if d > 0}
    left = capacity
    while open_ and left > 1e-12:
        total_w = sum(weights.get(t, 1.0) for t in open_)
        offer = {t: left * weights.get(t, 1.0) / total_w for t in open_}
        done = {t for t in open_ if demand[t] - fair[t] <= offer[t]}
        if not done:
            for t in open_:
                fair[t] += offer[t]
            break
        for t in done:
            left -= demand[t] - fair[t]
            fair[t] = demand[t]
        open_ -= done
    return fair


def fairness(
    served: Mapping[str, float], demand: Mapping[str, float], weights: Mapping[str, float]
) -> float:
    """Jain's index of served / weighted-max-min-fair share: 1.0 means exactly fair."""
    fair = max_min_fair(demand, weights, sum(served.values()))
    return jain_index(served.get(t, 0.0) / f for t, f in fair.items() if f > 0)


class SlidingSums:
    """Sums of values per key over the last ``window_s`` seconds.

    Events leave the window as new ones are added, not only when the sums are read: read only
    by a metrics scrape, the events of every request since the last scrape were kept (with no
    scraper, for good: the gateway's steady memory growth in issue 23's hour-long soak)."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._events: deque[tuple[float, str, float]] = deque()
        self._sums: defaultdict[str, float] = defaultdict(float)

    def __len__(self) -> int:
        """Events held (those of the window, and of keys not yet pruned)."""
        return len(self._events)

    def add(self, now: float, key: str, value: float) -> None:
        """Count ``value`` for ``key`` at ``now``."""
        self._prune(now)
        self._events.append((now, key, value))
        self._sums[key] += value

    def totals(self, now: float) -> dict[str, float]:
        """The sums over ``(now - window_s, now]``."""
        self._prune(now)
        return {k: max(v, 0.0) for k, v in self._sums.items() if v > 1e-9}

    def _prune(self, now: float) -> None:
        """Drop the events that left the window, and the keys left with nothing in it."""
        events, sums = self._events, self._sums
        while events and events[0][0] <= now - self.window_s:
            _, key, value = events.popleft()
            sums[key] -= value
            if sums[key] <= 1e-9:
                del sums[key]


@dataclass(frozen=True, slots=True)
class TenantStats:
    """One tenant's view of a pool: cumulative counts, windowed share, recent percentiles."""

    tenant: str
    admitted: int
    completed: int
    rejected: Mapping[str, int]
    offered_cost: float
    """Cost that arrived within the window (admitted or not)."""
    served_cost: float
    """Cost dispatched within the window."""
    share: float
    """This tenant's part of the cost served in the window."""
    fair_share: float
    """Its weighted max-min fair part of the same (weights scaled by priority class)."""
    wait_p50_s: float
    wait_p99_s: float
    latency_p50_s: float
    latency_p99_s: float


@dataclass(frozen=True, slots=True)
class StatsSnapshot:
    """A pool's tenants and its fairness index over the window."""

    tenants: tuple[TenantStats, ...]
    jain: float


@dataclass(slots=True)
class _Tenant:
    weight: float = 1.0
    priority: Priority = Priority.INTERACTIVE
    admitted: int = 0
    completed: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    waits: deque[float] = field(default_factory=deque)
    latencies: deque[float] = field(default_factory=deque)


class PoolStats:
    """Counters a pool's scheduler keeps per tenant (metrics export reads :meth:`snapshot`)."""

    def __init__(
        self,
        window_s: float = 60.0,
        max_samples: int | None = 10_000,
        class_weights: Mapping[Priority, float] | None = None,
    ) -> None:
        self.window_s = window_s
        self.max_samples = max_samples
        self.class_weights = dict(class_weights or {})
        self.reset()

    def reset(self, now: float = -math.inf) -> None:
        """Start over: only requests arriving from ``now`` on count (the end of a warm-up)."""
        self._since = now
        self._tenants: dict[str, _Tenant] = {}
        self._served = SlidingSums(self.window_s)
        self._offered = SlidingSums(self.window_s)

    def _tenant(self, request: Request) -> _Tenant:
        t = self._tenants.get(request.tenant)
        if t is None:
            n = self.max_samples
            t = _Tenant(waits=deque(maxlen=n), latencies=deque(maxlen=n))
            self._tenants[request.tenant] = t
        t.weight, t.priority = request.weight, request.priority
        return t

    def offered(self, now: float, request: Request, reason: str | None) -> None:
        """Count an arrival: admitted when ``reason`` is ``None``, else rejected for ``reason``."""
        t = self._tenant(request)
        self._offered.add(now, request.tenant, request.cost)
        if reason is None:
            t.admitted += 1
        else:
            t.rejected[reason] += 1

    def expired(self, request: Request) -> None:
        """Count a request dropped while queued because its deadline could not be met."""
        if request.arrival >= self._since:
            self._tenant(request).rejected["deadline_expired"] += 1

    def dispatched(self, now: float, request: Request) -> None:
        """Count service given to a tenant and how long the request waited for it."""
        self._served.add(now, request.tenant, request.cost)
        if request.arrival >= self._since:
            self._tenant(request).waits.append(now - request.arrival)

    def completed(self, now: float, request: Request) -> None:
        """Record a request's latency from arrival to completion."""
        if request.arrival < self._since:
            return
        t = self._tenant(request)
        t.completed += 1
        t.latencies.append(now - request.arrival)

    def snapshot(self, now: float) -> StatsSnapshot:
        """Plain data for metrics, reports and the console."""
        served = self._served.totals(now)
        offered = self._offered.totals(now)
        total = sum(served.values())
        fair = max_min_fair(offered, self._weights(offered), total)
        tenants = tuple(
            TenantStats(
                tenant=name,
                admitted=t.admitted,
                completed=t.completed,
                rejected=dict(t.rejected),
                offered_cost=offered.get(name, 0.0),
                served_cost=served.get(name, 0.0),
                share=served.get(name, 0.0) / total if total else 0.0,
                fair_share=fair.get(name, 0.0) / total if total else 0.0,
                wait_p50_s=percentile(t.waits, 50),
                wait_p99_s=percentile(t.waits, 99),
                latency_p50_s=percentile(t.latencies, 50),
                latency_p99_s=percentile(t.latencies, 99),
            )
            for name, t in sorted(self._tenants.items())
        )
        jain = jain_index(served.get(t, 0.0) / f for t, f in fair.items() if f > 0)
        return StatsSnapshot(tenants, jain)

    def _weights(self, active: Mapping[str, float]) -> dict[str, float]:
        """Each active tenant's weight within its class, times its class's weight."""
        tenants = {name: self._tenants[name] for name in active}
        in_class: defaultdict[Priority, float] = defaultdict(float)
        for t in tenants.values():
            in_class[t.priority] += t.weight
        return {
            name: self.class_weights.get(t.priority, 1.0) * t.weight / in_class[t.priority]
            for name, t in tenants.items()
        }
