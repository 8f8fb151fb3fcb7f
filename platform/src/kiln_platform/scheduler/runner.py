"""The scheduler on the asyncio clock: what the gateway awaits around each call to a worker."""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from kiln_platform.errors import DeadlineExceeded, KilnError, Overloaded, ServiceUnavailable
from kiln_platform.scheduler.admission import RejectReason
from kiln_platform.scheduler.schemas import Credit, Dispatch, Priority, Request

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

    from kiln_platform.scheduler.admission import Decision
    from kiln_platform.scheduler.core import PoolScheduler

T = TypeVar("T")

_MESSAGES = {
    RejectReason.TENANT_QUEUE_FULL: "You have too many requests queued for this model.",
    RejectReason.TENANT_OVER_SHARE: "You are using more than your share of this model's capacity.",
    RejectReason.POOL_QUEUE_FULL: "This model's queue is full.",
    RejectReason.POOL_OVERLOADED: "This model is overloaded and cannot meet the deadline.",
    RejectReason.DEADLINE_TOO_SHORT: "The deadline is shorter than this request's service time.",
    RejectReason.DEADLINE_EXPIRED: "The request could not be started within its deadline.",
}


def rejection(reason: RejectReason, retry_after_s: float | None = None) -> KilnError:
    """The Kiln error the gateway answers a rejection with (429, 503 or 504)."""
    message = _MESSAGES[reason]
    if reason.status == 429:
        return Overloaded(f"{message} Retry after the indicated time.", retry_after=retry_after_s)
    if reason.status == 503:
        return ServiceUnavailable(f"{message} Retry shortly.", retry_after=retry_after_s)
    return DeadlineExceeded(message)


def _rejected(decision: Decision) -> KilnError:
    assert decision.reason is not None
    return rejection(decision.reason, decision.retry_after_s)


EXPRESS_CREDITS = 3
"""Spare credits per worker for the express lane: a light tenant's burst (its request and those
it sends while that runs) queues ahead of the flood in the worker (docs/scheduler.md)."""


@dataclass(slots=True)
class Lease:
    """A dispatched request's hold on one worker credit (its express credit if ``express``)."""

    worker: str
    actual_cost: float | None = None
    express: bool = False
    waited_s: float = 0.0
    """Arrival to dispatch, in the pool's fair queue."""


class PoolRunner:
    """Queues requests in a :class:`PoolScheduler` and runs each on the worker it is sent to.

    ``slots()`` returns the ready workers and the credits each advertises; the runner subtracts
    what it has in flight on each, so a worker is never sent more than it advertised. With the
    express lane on (``PolicyConfig.express``) each worker also holds ``express()`` spare express
    credits (``EXPRESS_CREDITS``), counted apart, for requests of tenants holding no normal credit.

    ``capacity()`` returns the cost (items) each worker's queue holds, where it is bounded: a
    worker is sent a request only if its cost fits beside what is in flight there, or if nothing
    is (a request bigger than the whole queue goes alone, for the worker to refuse).
    """

    def __init__(
        self,
        scheduler: PoolScheduler,
        slots: Callable[[], Mapping[str, int]],
        capacity: Callable[[], Mapping[str, float]] = dict,
        planned: Callable[[], int] = lambda: 0,
        express: Callable[[], int] = lambda: EXPRESS_CREDITS,
    ) -> None:
        self.scheduler = scheduler
        self._slots = slots
        self._capacity = capacity
        self._planned = planned
        self._spare = express
        """Express credits per worker: ``EXPRESS_CREDITS``, or this gateway's share of them in a
        shared fleet (``SharedBackend.express``)."""
        """Slots the pool will have once its starting workers are ready (admission's rate while
        none is: a pool starting from zero admits what it will serve, not nothing)."""
        self._waiting: dict[str, asyncio.Future[Dispatch]] = {}
        self._in_flight: Counter[str] = Counter()
        self._cost: dict[str, float] = {}
        """Cost in flight, by worker (normal and express)."""
        self._express: Counter[str] = Counter()
        """Express credits in use, by worker."""
        self._timer: asyncio.Handle | None = None
        self._timer_at = 0.0
        """When ``_timer`` fires: uvloop's ``call_at`` for a time already past returns a plain
        ``Handle``, which has no ``when()`` (that was a 500 under overload)."""
        self.on_wait: Callable[[Request, float], None] = lambda request, seconds: None
        """Called with each request's queue wait when it is dispatched (for metrics)."""
        self.on_done: Callable[[], None] = lambda: None
        """Called when a dispatched request's slot is given back (a pool's cold start ends)."""

    @staticmethod
    def now() -> float:
        """The scheduler's clock: the event loop's monotonic time."""
        return asyncio.get_running_loop().time()

    def request(
        self,
        request_id: str,
        tenant: str,
        cost: float,
        *,
        timeout_s: float | None,
        priority: Priority = Priority.INTERACTIVE,
        weight: float = 1.0,
        least: float | None = None,
    ) -> Request:
        """A request arriving now, with its deadline on the scheduler's clock (``least``: the
        cost it surely takes, if ``cost`` is a bound)."""
        now = self.now()
        deadline = None if timeout_s is None else now + timeout_s
        return Request(request_id, tenant, cost, now, deadline, priority, weight, least)

    def screen(self, request: Request) -> None:
        """Reject now what :meth:`slot` would reject, before the caller spends CPU preparing it.

        A flood that is turned away then costs the gateway no tokenizing; admitted requests are
        decided again by :meth:`slot`.
        """
        decision = self.scheduler.screen(request, self.now())
        if not decision.admitted:
            raise _rejected(decision)

    @asynccontextmanager
    async def slot(self, request: Request) -> AsyncIterator[Lease]:
        """Admit, wait for a worker, hold its credit for the ``async with`` body.

        Rejections raise Kiln errors before anything waits. Set ``lease.actual_cost`` to charge
        what the request really cost (tokens generated, say) instead of its estimate.
        """
        decision = self.scheduler.submit(request, self.now())
        if not decision.admitted:
            raise _rejected(decision)
        queued_at = time.perf_counter()  # uvloop's clock ticks in whole milliseconds
        future: asyncio.Future[Dispatch] = asyncio.get_running_loop().create_future()
        self._waiting[request.id] = future
        self.poke()
        try:
            sent = await future
        except asyncio.CancelledError:  # the client went away
            self._waiting.pop(request.id, None)
            if not future.done() or future.cancelled():
                self.scheduler.cancel(request.id)
            elif future.exception() is None:  # dispatched in the same tick: give the credit back
                self._finish(future.result(), None, ok=False)
            raise
        waited = time.perf_counter() - queued_at
        self.on_wait(request, waited)
        lease, ok = Lease(sent.worker, express=sent.express, waited_s=waited), False
        try:
            yield lease
            ok = True
        finally:
            self._finish(sent, lease.actual_cost, ok=ok)
            self.on_done()

    async def run(
        self,
        request: Request,
        call: Callable[[Request, str], Awaitable[T]],
        *,
        actual_cost: Callable[[T], float] | None = None,
    ) -> T:
        """Admit, wait for a worker, and ``call(request, worker)``; rejections raise Kiln errors."""
        async with self.slot(request) as lease:
            result = await call(request, lease.worker)
            lease.actual_cost = None if actual_cost is None else actual_cost(result)
            return result

    def poke(self) -> None:
        """Fill free credits now (call it too when a worker becomes ready or changes slots)."""
        now, wasted = self.now(), True
        slots, capacity, spare = self._slots(), self._capacity(), self._spare()
        self.scheduler.slots = sum(slots.values()) or self._planned()
        while wasted:
            wasted = False
            credits = [
                Credit(w, n - self._in_flight[w], spare - self._express[w],
                       cap - self._cost.get(w, 0.0), cap)
                for w, n in slots.items()
                for cap in [capacity.get(w, math.inf)]
            ]  # fmt: skip
            usable = [c for c in credits if c.free > 0 or c.express > 0]
            dispatches, expired = self.scheduler.dispatch(now, usable)
            for d in dispatches:
                future = self._waiting.pop(d.request.id, None)
                if future is None or future.done():  # cancelled, its task not resumed yet
                    self.scheduler.complete(d.request.id, now, ok=False)
                    wasted = True
                    continue
                if d.express:
                    self._express[d.worker] += 1
                else:
                    self._in_flight[d.worker] += 1
                self._cost[d.worker] = self._cost.get(d.worker, 0.0) + d.request.cost
                future.set_result(d)
            self._fail(expired)
        self._arm()

    def _finish(self, sent: Dispatch, cost: float | None, *, ok: bool) -> None:
        if sent.express:
            self._express[sent.worker] -= 1
        else:
            self._in_flight[sent.worker] -= 1
        left = self._cost.pop(sent.worker) - sent.request.cost
        if left > 1e-9:
            self._cost[sent.worker] = left
        self.scheduler.complete(sent.request.id, self.now(), actual_cost=cost, ok=ok)
        self.poke()

    def _fail(self, expired: list[Request]) -> None:
        for r in expired:
            future = self._waiting.pop(r.id, None)
            if future is not None and not future.done():
                future.set_exception(rejection(RejectReason.DEADLINE_EXPIRED))

    def _arm(self) -> None:
        at = self.scheduler.next_expiry()
        if self._timer is not None and (at is None or self._timer_at != at):
            self._timer.cancel()
            self._timer = None
        if at is not None and self._timer is None:
            self._timer = asyncio.get_running_loop().call_at(at, self._on_timer)
            self._timer_at = at

    def _on_timer(self) -> None:
        self._timer = None
        self._fail(self.scheduler.expire(self.now()))
        self.poke()
