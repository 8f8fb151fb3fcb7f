"""``kiln simulate``: a discrete-event simulator driving the real scheduler on a virtual clock."""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from kiln_platform.scheduler import _simconfig, _simreport
from kiln_platform.scheduler._simconfig import parse_override
from kiln_platform.scheduler._simreport import SimulationReport, TenantReport, format_report
from kiln_platform.scheduler._simworker import SimWorker
from kiln_platform.scheduler.core import PoolScheduler
from kiln_platform.scheduler.schemas import Credit, Request

if TYPE_CHECKING:
    from collections.abc import Collection, Mapping
    from pathlib import Path

    from kiln_platform.scheduler._simconfig import SimConfig
    from kiln_platform.scheduler.stats import StatsSnapshot

__all__ = [
    "SimulationReport",
    "TenantReport",
    "format_report",
    "parse_override",
    "run_simulation",
    "simulate",
]

_WAKE, _EXPIRE, _ARRIVAL = 0, 1, 2  # at equal times: free credits first, then expire, then admit


def run_simulation(
    path: Path,
    *,
    seed: int = 0,
    only: Collection[str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    baseline: bool = False,
) -> SimulationReport:
    """Simulate the file at ``path``.

    ``only`` keeps just those tenants (a tenant's "alone" baseline: arrivals are seeded per
    tenant, so it sees exactly the same requests); ``overrides`` sets dotted keys of the file,
    e.g. ``{"pool.slots_per_worker": 4, "tenant.B.weight": 3}`` (see :func:`parse_override`);
    ``baseline`` also runs every tenant alone and reports its p99 then.
    """
    config = _simconfig.load(path, overrides)
    report = simulate(config, seed=seed, only=only, source=str(path))
    if not baseline:
        return report
    alone = {
        t.name: simulate(config, seed=seed, only={t.name}).tenant(t.name).latency_p99_s
        for t in report.tenants
    }
    tenants = tuple(replace(t, alone_p99_s=alone[t.name]) for t in report.tenants)
    return replace(report, tenants=tenants)


class _Run:
    """One run: the event heap, the simulated workers, and the real scheduler between them."""

    def __init__(self, config: SimConfig, seed: int, only: Collection[str] | None) -> None:
        pool = config.pool
        self.config = config
        self.workers = [
            SimWorker(f"w{i}", pool.slots_per_worker, pool.service, preempt=pool.preempt)
            for i in range(pool.workers)
        ]
        self.index = {w.name: i for i, w in enumerate(self.workers)}
        self.sched = PoolScheduler(config.scheduler, slots=pool.workers * pool.slots_per_worker)
        self.stream = _simconfig.arrivals(config, seed, only)
        self.events: list[tuple[float, int, int, Request | int | None]] = []
        self.seq = itertools.count()
        self.expire_at = math.inf
        self.done_n, self.done_cost = 0, 0.0
        self.at_end: StatsSnapshot | None = None  # shares as arrivals stop, before queues drain

    def push(self, at: float, kind: int, payload: Request | int | None) -> None:
        heapq.heappush(self.events, (at, kind, next(self.seq), payload))

    def run(self) -> float:
        """Process every event; returns the time of the last one."""
        now, warming, end = 0.0, self.config.warmup_s > 0, self.config.duration_s
        self._next_arrival()
        while self.events:
            now, _, _, payload = heapq.heappop(self.events)
            if warming and now >= self.config.warmup_s:
                self.sched.stats.reset(now)
                warming = False
            if self.at_end is None and now >= end:
                self.at_end = self.sched.snapshot(now)
            if isinstance(payload, Request):
                self.sched.submit(payload, now)
                self._next_arrival()
            elif isinstance(payload, int):
                self._wake(payload, now)
            else:
                self.expire_at = math.inf
                self.sched.expire(now)
            self._pump(now)
        return now

    def _next_arrival(self) -> None:
        request = next(self.stream, None)
        if request is not None:
            self.push(request.arrival, _ARRIVAL, request)

    def _wake(self, i: int, now: float) -> None:
        finished, wake_at = self.workers[i].wake(now)
        for r in finished:
            self.sched.complete(r.id, now)
            if self.config.warmup_s <= now <= self.config.duration_s:
                self.done_n, self.done_cost = self.done_n + 1, self.done_cost + r.cost
        if wake_at is not None:
            self.push(wake_at, _WAKE, i)

    def _pump(self, now: float) -> None:
        credits = [
            Credit(w.name, w.free, w.express_free)
            for w in self.workers
            if w.free > 0 or w.express_free > 0
        ]
        if credits and len(self.sched.queue):
            dispatches, _ = self.sched.dispatch(now, credits)
            for d in dispatches:
                i = self.index[d.worker]
                wake_at = self.workers[i].accept(d.request, now, express=d.express)
                if wake_at is not None:
                    self.push(wake_at, _WAKE, i)
        check = self.sched.next_expiry()
        if check is not None and check < self.expire_at:
            self.expire_at = check
            self.push(max(check, now), _EXPIRE, None)


def simulate(
    config: SimConfig, *, seed: int = 0, only: Collection[str] | None = None, source: str = ""
) -> SimulationReport:
    """Run ``config`` to completion: arrivals stop at ``duration_s``, then the queues drain."""
    run = _Run(config, seed, only)
    final = run.sched.snapshot(run.run())
    at_end = run.at_end or final
    return _simreport.build(
        config, final, at_end, seed=seed, source=source, done=(run.done_n, run.done_cost)
    )
