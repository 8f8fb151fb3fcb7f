"""A simulated runtime worker: credits (normal and express), a local queue, and the service-time
model ``a * n + b``, with the real worker's express rules: express requests queue ahead of normal
ones, batch only with each other, and stop a normal batch with at least half of it left."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kiln_platform.scheduler.runner import EXPRESS_CREDITS

if TYPE_CHECKING:
    from kiln_platform.scheduler._simconfig import Service
    from kiln_platform.scheduler.schemas import Request


@dataclass(frozen=True, slots=True)
class _Queued:
    at: float
    request: Request
    express: bool = False
    preempted: bool = False


class SimWorker:
    """Serves what the scheduler dispatches; tells the simulator when to wake it next."""

    def __init__(self, name: str, slots: int, service: Service, *, preempt: bool = True) -> None:
        self.name = name
        self.slots = slots
        self.service = service
        self.preempt = preempt
        self.in_flight = 0
        self.express_in_flight = 0
        self._express: set[str] = set()
        self._waiting: deque[_Queued] = deque()
        self._running: list[tuple[float, Request]] = []
        self._batch: list[_Queued] = []
        self._batch_start = 0.0
        self._batch_end: float | None = None
        self._idle_since = 0.0

    @property
    def free(self) -> int:
        """Normal credits this worker advertises."""
        return self.slots - self.in_flight

    @property
    def express_free(self) -> int:
        """Express credits this worker advertises."""
        return EXPRESS_CREDITS - self.express_in_flight

    def accept(self, request: Request, now: float, *, express: bool = False) -> float | None:
        """Take a dispatched request; returns when to wake the worker, if it must be woken."""
        if (self.express_free if express else self.free) <= 0:
            raise RuntimeError(f"{self.name} over-filled ({'express' if express else 'normal'})")
        if express:
            self.express_in_flight += 1
            self._express.add(request.id)
        else:
            self.in_flight += 1
        if self.service.kind == "per_request":
            end = now + self.service.a * request.cost + self.service.b
            self._running.append((end, request))
            return end
        queued = _Queued(now, request, express)
        if not express:
            self._waiting.append(queued)
            return self._maybe_start(now)
        self._insert([queued])
        if self._stoppable(now):
            self._insert([_Queued(q.at, q.request, preempted=True) for q in self._batch])
            self._running, self._batch, self._batch_end = [], [], None
        return self._maybe_start(now)

    def wake(self, now: float) -> tuple[list[Request], float | None]:
        """Finish what is due at ``now``; returns the finished requests and the next wake-up."""
        done = [r for end, r in self._running if end <= now]
        if done:
            self._running = [(end, r) for end, r in self._running if end > now]
            for r in done:
                if r.id in self._express:
                    self._express.discard(r.id)
                    self.express_in_flight -= 1
                else:
                    self.in_flight -= 1
            if self.service.kind == "batch":
                self._batch, self._batch_end, self._idle_since = [], None, now
        if self.service.kind == "per_request":
            return done, None
        return done, self._maybe_start(now)

    def _stoppable(self, now: float) -> bool:
        """Whether the running batch is a normal one, never stopped, with at least half left."""
        if not self.preempt or self._batch_end is None or not self._batch:
            return False
        if self._batch[0].express or any(q.preempted for q in self._batch):
            return False
        return self._batch_end - now >= now - self._batch_start

    def _insert(self, entries: list[_Queued]) -> None:
        """Put ``entries`` behind the queued express requests, ahead of the normal ones."""
        at = next((i for i, q in enumerate(self._waiting) if not q.express), len(self._waiting))
        self._waiting.rotate(-at)
        self._waiting.extendleft(reversed(entries))
        self._waiting.rotate(at)

    def _maybe_start(self, now: float) -> float | None:
        if self._batch_end is not None or not self._waiting:
            return None  # a batch is running: its end is already scheduled
        s = self.service
        express = self._waiting[0].express
        kind = [q for q in self._waiting if q.express is express]
        queued = sum(q.request.cost for q in kind)
        since = max(kind[0].at, self._idle_since)  # the delay runs while idle
        full = queued >= s.max_batch_size or self.in_flight >= self.slots
        if not full and now < since + s.max_delay_s:
            return since + s.max_delay_s
        n, batch = 0.0, []
        while self._waiting and self._waiting[0].express is express:
            head = self._waiting[0]
            if n and n + head.request.cost > s.max_batch_size:
                break
            batch.append(self._waiting.popleft())
            n += head.request.cost
        self._batch, self._batch_start = batch, now
        self._batch_end = now + s.a * n + s.b
        self._running = [(self._batch_end, q.request) for q in batch]
        return self._batch_end
