"""One pool's queue: fair share across tenants, priority classes, deadlines, dispatch by credits."""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kiln_platform.scheduler._fairshare import VirtualTime
from kiln_platform.scheduler.schemas import (
    Backlog,
    Credit,
    Dispatch,
    Priority,
    Request,
    TenantBacklog,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Iterable, Sequence


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """Knobs of the queueing policy."""

    batch_share: float = 0.1
    """Share of dispatched cost the batch class gets while both classes are backlogged."""
    max_lag: float = math.inf
    """Most virtual time (cost / weight) one request may charge: bounds how long a tenant's
    past use (a giant request, a tiny weight) can hold back its next request."""
    rate_half_life_s: float = 2.0
    """Half-life of each tenant's admitted-cost rate, which admission projects forward."""
    express: bool = True
    """The express lane: spare credits per worker for tenants holding no normal credit."""
    express_depth: int = 3
    """A tenant with more requests than this queued is backlogged: it never takes the lane; a light
    tenant may lead the others in fair order by this many requests (its burst allowance)."""

    def __post_init__(self) -> None:
        if not 0.0 < self.batch_share < 1.0:
            raise ValueError("batch_share must be between 0 and 1 (exclusive)")

    def class_weight(self, priority: Priority) -> float:
        """The weight of a priority class in the fair share between classes."""
        return self.batch_share if priority is Priority.BATCH else 1.0 - self.batch_share


@dataclass(slots=True, eq=False)
class _Entry:
    request: Request
    queued: bool = True


@dataclass(slots=True, eq=False)
class _Flow:
    weight: float
    entries: deque[_Entry] = field(default_factory=deque)
    count: int = 0
    cost: float = 0.0


def _no_service(cost: float) -> float:
    return 0.0


class PoolQueue:
    """Two-level start-time fair queue: classes by ``batch_share``, tenants by plan weight."""

    def __init__(self, config: PolicyConfig | None = None) -> None:
        self.config = config or PolicyConfig()
        self._classes: VirtualTime[Priority] = VirtualTime()
        self._tenants = {p: VirtualTime[str](self.config.max_lag) for p in Priority}
        self._flows: dict[Priority, dict[str, _Flow]] = {p: {} for p in Priority}
        self._entries: dict[str, _Entry] = {}
        self._deadlines: list[tuple[float, int, _Entry]] = []
        self._seq = 0
        self._tau = self.config.rate_half_life_s / math.log(2)
        self._rates: dict[tuple[Priority, str], tuple[float, float, float]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._entries

    def push(self, request: Request, service_time: Callable[[float], float] = _no_service) -> None:
        """Queue ``request`` behind its tenant's earlier requests of the same class."""
        if request.id in self._entries:
            raise ValueError(f"request {request.id!r} is already queued")
        flows = self._flows[request.priority]
        flow = flows.get(request.tenant)
        if flow is None:
            flow = flows[request.tenant] = _Flow(request.weight)
        entry = _Entry(request)
        flow.weight = request.weight
        flow.entries.append(entry)
        flow.count += 1
        flow.cost += request.cost
        self._entries[request.id] = entry
        key = (request.priority, request.tenant)
        at = max(request.arrival, self._rates.get(key, (0.0, request.arrival, 0.0))[1])
        self._rates[key] = (self._rate(key, at) + request.cost / self._tau, at, request.weight)
        if request.deadline is not None:
            self._watch(entry, request.deadline - service_time(request.least_cost))

    def cancel(self, request_id: str) -> Request | None:
        """Remove a queued request (client gone); ``None`` if it is not queued."""
        entry = self._entries.get(request_id)
        if entry is None:
            return None
        self._remove(entry)
        return entry.request

    def expire(self, now: float, service_time: Callable[[float], float]) -> list[Request]:
        """Remove and return queued requests that can no longer finish before their deadline."""
        expired: list[Request] = []
        heap = self._deadlines
        while heap and heap[0][0] <= now:
            _, _, entry = heapq.heappop(heap)
            if not entry.queued:
                continue
            r = entry.request
            assert r.deadline is not None
            latest_start = r.deadline - service_time(r.least_cost)
            if latest_start <= now:
                self._remove(entry)
                expired.append(r)
            else:  # the service got faster since it was queued
                self._watch(entry, latest_start)
        return expired

    def next_expiry(self) -> float | None:
        """When :meth:`expire` should run next (the earliest latest-start time), if ever."""
        heap = self._deadlines
        while heap and not heap[0][2].queued:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def next_dispatch(
        self,
        now: float,
        credits: Sequence[Credit],
        service_time: Callable[[float], float] = _no_service,
        busy: Collection[str] = (),
    ) -> tuple[list[Dispatch], list[Request]]:
        """Fill free credits in fair order; also return requests found hopeless on the way.

        Spare ``express`` credits go first, each to the fair head among the light tenants:
        holding no normal credit (not in ``busy``), at most ``express_depth`` requests queued,
        and at most ``express_depth`` requests ahead of the others in fair order (a start tag
        within ``express_depth`` times its head's ``cost / weight`` of the earliest other queued
        tenant's). The lane is charged like any dispatch, but a request served ahead of its turn
        does not move ``v``, so the lead stays bounded and the shares do not change beyond it;
        a backlogged tenant never takes the lane, and a light tenant's requests run ahead of the
        backlog in the worker whether or not a normal credit is free. Normal credits follow, in
        fair order.

        A head costing more than a worker's ``room`` is not sent there; if no worker with a credit
        has room for it, dispatch stops and it keeps its place (bigger requests are not starved by
        smaller ones behind them).
        """
        dispatches: list[Dispatch] = []
        expired: list[Request] = []
        by = {c.worker: c for c in credits}
        room = {c.worker: c.room for c in credits}

        def fits(r: Request, worker: str) -> bool:
            return by[worker].fits(r.cost, room[worker])

        spare = [c.worker for c in credits for _ in range(c.express)] if self.config.express else []
        while spare and self._entries:
            r = self._pop(now, service_time, expired, busy, lambda r: fits(r, spare[0]))
            if r is None:
                break
            dispatches.append(Dispatch(r, spare.pop(0), express=True))
            room[dispatches[-1].worker] -= r.cost
        free = {c.worker: c.free for c in credits if c.free > 0}

        def anywhere(r: Request) -> bool:
            return any(fits(r, w) for w in free)

        while free and (r := self._pop(now, service_time, expired, None, anywhere)) is not None:
            worker = max((w for w in free if fits(r, w)), key=lambda w: (free[w], room[w]))
            dispatches.append(Dispatch(r, worker))  # the least loaded worker it fits
            room[worker] -= r.cost
            free[worker] -= 1
            if not free[worker]:
                del free[worker]
        if len(self._deadlines) > 2 * len(self._entries) + 1024:  # drop entries that left
            self._deadlines = [d for d in self._deadlines if d[2].queued]
            heapq.heapify(self._deadlines)
        return dispatches, expired

    def _pop(
        self,
        now: float,
        service_time: Callable[[float], float],
        expired: list[Request],
        busy: Collection[str] | None = None,
        fits: Callable[[Request], bool] = lambda r: True,
    ) -> Request | None:
        """Remove and charge the fair head that can still finish (an express one if ``busy``);
        ``None`` if there is none or it does not ``fit`` (it stays queued).

        An express request served ahead of its turn (not the fair head of all tenants) leaves
        ``v`` where it is.
        """
        while (head := self._head(busy)) is not None:
            priority, tenant, entry = head
            tags = self._tenants[priority]
            in_turn = busy is None or tags.pick(self._flows[priority]) == tenant
            r = entry.request
            if r.deadline is not None and now + service_time(r.least_cost) >= r.deadline:
                self._remove(entry)
                expired.append(r)
                continue
            if not fits(r):
                return None
            self._remove(entry)
            self._classes.charge(priority, r.cost, self.config.class_weight(priority))
            tags.charge(tenant, r.cost, r.weight, advance=in_turn)
            return r
        return None

    def adjust(self, request: Request, actual_cost: float) -> None:
        """Charge the difference once the real cost is known (an LLM's output tokens)."""
        delta = actual_cost - request.cost
        self._tenants[request.priority].adjust(request.tenant, delta)
        self._classes.adjust(request.priority, delta)

    def backlog(self, now: float) -> Backlog:
        """A snapshot of what each tenant has queued, and how fast it has been adding work."""
        rates = {key: self._rate(key, now) for key in self._rates}
        self._rates = {k: v for k, v in self._rates.items() if rates[k] > 1e-6}
        flows = [
            TenantBacklog(t, p, f.weight, f.count, max(f.cost, 0.0), rates.get((p, t), 0.0))
            for p, by_tenant in self._flows.items()
            for t, f in by_tenant.items()
        ]
        idle = [
            TenantBacklog(t, p, self._rates[p, t][2], 0, 0.0, r)
            for (p, t), r in rates.items()
            if r > 1e-6 and t not in self._flows[p]
        ]
        return Backlog(tuple(flows + idle))

    def _rate(self, key: tuple[Priority, str], now: float) -> float:
        rate, at, _ = self._rates.get(key, (0.0, now, 1.0))
        return rate * math.exp(-max(now - at, 0.0) / self._tau)

    def _head(self, busy: Collection[str] | None = None) -> tuple[Priority, str, _Entry] | None:
        """The fair head; with ``busy``, among the tenants eligible for an express credit."""
        if busy is None:
            priority = self._classes.pick(p for p, flows in self._flows.items() if flows)
            tenants: Iterable[str] = () if priority is None else self._flows[priority]
        else:
            # interactive only: batch work (async jobs, shadow copies) never jumps the worker's
            # queue nor stops its batches
            tenants = self._express(Priority.INTERACTIVE, busy)
            priority = Priority.INTERACTIVE if tenants else None
        if priority is None:
            return None
        flows = self._flows[priority]
        tenant = self._tenants[priority].pick(tenants)
        assert tenant is not None
        entries = flows[tenant].entries
        while not entries[0].queued:
            entries.popleft()
        return priority, tenant, entries[0]

    def _express(self, priority: Priority, busy: Collection[str]) -> list[str]:
        """Light tenants of ``priority`` (no normal credit, a short queue) whose head would start
        at most ``express_depth`` times its ``cost / weight`` after the earliest other queued
        tenant's."""
        tags, flows = self._tenants[priority], self._flows[priority]
        starts = sorted((tags.start(t), t) for t in flows)

        def light(tenant: str, start: float) -> bool:
            flow = flows[tenant]
            if tenant in busy or flow.count > self.config.express_depth:
                return False
            head = next(e.request for e in flow.entries if e.queued)
            lead = self.config.express_depth * min(head.cost / flow.weight, self.config.max_lag)
            return start <= next((s for s, t in starts if t != tenant), math.inf) + lead

        return [t for s, t in starts if light(t, s)]

    def _watch(self, entry: _Entry, latest_start: float) -> None:
        self._seq += 1
        heapq.heappush(self._deadlines, (latest_start, self._seq, entry))

    def _remove(self, entry: _Entry) -> None:
        r = entry.request
        entry.queued = False
        del self._entries[r.id]
        flows = self._flows[r.priority]
        flow = flows[r.tenant]
        flow.count -= 1
        flow.cost -= r.cost
        if flow.count == 0:
            del flows[r.tenant]
