"""One pool's scheduler, sans I/O: admission, the fair queue, the service model and the stats.

The caller owns the clock and the workers. It calls ``submit`` when a request arrives,
``dispatch`` whenever credits may have freed up, ``expire`` at ``next_expiry``, and ``complete``
when a worker answers.
The gateway does so on the asyncio clock (:mod:`.runner`), ``kiln simulate`` on a virtual one.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kiln_platform.scheduler import service
from kiln_platform.scheduler.admission import AdmissionLimits, Decision, RejectReason, admit
from kiln_platform.scheduler.policy import PolicyConfig, PoolQueue
from kiln_platform.scheduler.schemas import Priority
from kiln_platform.scheduler.service import ServiceConfig
from kiln_platform.scheduler.stats import PoolStats, StatsSnapshot

if TYPE_CHECKING:
    from collections.abc import Sequence

    from kiln_platform.scheduler.schemas import Credit, Dispatch, Request


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Every knob of a pool's scheduler (part of the settings, passed down at start-up)."""

    policy: PolicyConfig = field(default_factory=PolicyConfig)
    limits: AdmissionLimits = field(default_factory=AdmissionLimits)
    service: ServiceConfig = field(default_factory=ServiceConfig)
    stats_window_s: float = 60.0
    max_samples: int | None = 10_000
    probe_after_s: float = 1.0
    """An idle pool that completed nothing for this long forgets its service-time estimate
    (back to the prior) rather than refuse a request as too slow for its deadline: only
    completions correct the estimate, so an overload that inflated it (dispatch-to-completion
    times stretched by the overload itself) made every later request a 504 at once, for good
    (``bench/overload.py``)."""


class PoolScheduler:
    """Admit, queue fairly, dispatch by credits, learn the service rate, and count it all."""

    def __init__(self, config: SchedulerConfig | None = None, *, slots: int = 1) -> None:
        self.config = config = config or SchedulerConfig()
        self.slots = slots
        """Slots of the pool's ready workers (for the capacity estimate); update as they change."""
        self.queue = PoolQueue(config.policy)
        self.model = service.prior(config.service)
        self._line = service.line(self.model)
        weights = {p: config.policy.class_weight(p) for p in Priority}
        self.stats = PoolStats(config.stats_window_s, config.max_samples, weights)
        self._in_flight: dict[str, tuple[Request, float, bool]] = {}
        self._on_slots: Counter[str] = Counter()
        """Tenants' requests in flight on normal (not express) credits."""
        self._busy_since: float | None = None

    def service_time(self, cost: float) -> float:
        """Predicted seconds from dispatch to completion for ``cost``."""
        a, b = self._line
        return a * cost + b

    def rate(self) -> float:
        """Cost per second the pool is expected to serve while saturated."""
        return service.service_rate(self.model, self.slots)

    def submit(self, request: Request, now: float) -> Decision:
        """Admit and queue ``request``, or reject it at once."""
        decision = self._admit(request, now)
        self.stats.offered(now, request, None if decision.reason is None else decision.reason.value)
        if decision.admitted:
            self.queue.push(request, self.service_time)
            self._track(now)
        return decision

    def screen(self, request: Request, now: float) -> Decision:
        """Admission without queueing, for a request not yet ready to submit (not tokenized).

        A rejection is final and counted as :meth:`submit` counts it; an admission commits to
        nothing: the caller prepares the request and :meth:`submit` decides again.
        """
        decision = self._admit(request, now)
        if decision.reason is not None:
            self.stats.offered(now, request, decision.reason.value)
        return decision

    def _admit(self, request: Request, now: float) -> Decision:
        decision = self._decide(request, now)
        if decision.reason is RejectReason.DEADLINE_TOO_SHORT and self._stale(now):
            self.model = service.prior(self.config.service)  # forget what an overload taught
            self._line = service.line(self.model)
            decision = self._decide(request, now)
        return decision

    def _stale(self, now: float) -> bool:
        """Idle, and no completion for ``probe_after_s``: the estimate may be an overload's."""
        last = self.model.last_done
        idle = not self._in_flight and not len(self.queue)
        return idle and last is not None and now - last >= self.config.probe_after_s

    def _decide(self, request: Request, now: float) -> Decision:
        return admit(
            request,
            self.queue.backlog(now),
            now=now,
            rate=self.rate(),
            service_s=self.service_time(request.least_cost),
            typical_service_s=self.service_time(self.model.mean_cost),
            limits=self.config.limits,
            policy=self.config.policy,
        )

    def dispatch(
        self, now: float, credits: Sequence[Credit]
    ) -> tuple[list[Dispatch], list[Request]]:
        """Fill the workers' free credits; also return requests that expired on the way.

        Express credits go only to tenants holding no normal credit in the pool.
        """
        busy = self._on_slots.keys()
        dispatches, expired = self.queue.next_dispatch(now, credits, self.service_time, busy)
        for d in dispatches:
            self._in_flight[d.request.id] = (d.request, now, d.express)
            if not d.express:
                self._on_slots[d.request.tenant] += 1
            self.stats.dispatched(now, d.request)
        for r in expired:
            self.stats.expired(r)
        self._track(now)
        return dispatches, expired

    def expire(self, now: float) -> list[Request]:
        """Drop queued requests that can no longer meet their deadline (answer them 504)."""
        expired = self.queue.expire(now, self.service_time)
        for r in expired:
            self.stats.expired(r)
        return expired

    def next_expiry(self) -> float | None:
        """When to call :meth:`expire` next; ``None`` while nothing queued has a deadline."""
        return self.queue.next_expiry()

    def cancel(self, request_id: str) -> Request | None:
        """Remove a request that is still queued (the client went away)."""
        return self.queue.cancel(request_id)

    def complete(
        self, request_id: str, now: float, *, actual_cost: float | None = None, ok: bool = True
    ) -> Request | None:
        """A worker finished (``ok``) or failed a dispatched request; learn from it."""
        entry = self._in_flight.pop(request_id, None)
        if entry is None:
            return None
        request, dispatched_at, express = entry
        if not express:
            _decrement(self._on_slots, request.tenant)
        cost = request.cost if actual_cost is None else actual_cost
        if actual_cost is not None:
            self.queue.adjust(request, actual_cost)
        if ok:
            self.model = service.observe(
                self.model,
                self.config.service,
                now=now,
                cost=cost,
                seconds=now - dispatched_at,
                busy_since=self._busy_since,
                slots=self.slots,
            )
            self._line = service.line(self.model)
            self.stats.completed(now, request)
        return request

    def _track(self, now: float) -> None:
        # Saturated: every credit in use (the queue only holds requests while none is free).
        # Completions do not end saturation: the caller's next dispatch refills their credits.
        if len(self.queue) or len(self._in_flight) >= self.slots:
            if self._busy_since is None:
                self._busy_since = now
        else:
            self._busy_since = None

    @property
    def in_flight(self) -> int:
        """Requests dispatched and not yet completed."""
        return len(self._in_flight)

    def snapshot(self, now: float) -> StatsSnapshot:
        """Per-tenant stats and the fairness index over the stats window."""
        return self.stats.snapshot(now)


def _decrement(counter: Counter[str], key: str) -> None:
    """Count one less of ``key``, dropping it at zero (so ``keys()`` lists only live ones)."""
    if counter[key] > 1:
        counter[key] -= 1
    else:
        del counter[key]
