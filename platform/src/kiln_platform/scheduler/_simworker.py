"""A simulated runtime worker: credits, a local queue, and the service-time model ``a * n + b``."""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kiln_platform.scheduler._simconfig import Service
    from kiln_platform.scheduler.schemas import Request


class SimWorker:
    """Serves what the scheduler dispatches; tells the simulator when to wake it next."""

    def __init__(self, name: str, slots: int, service: Service) -> None:
        self.name = name
        self.slots = slots
        self.service = service
        self.in_flight = 0
        self._waiting: deque[tuple[float, Request]] = deque()
        self._running: list[tuple[float, Request]] = []
        self._batch_end: float | None = None
        self._idle_since = 0.0

    @property
    def free(self) -> int:
        """Credits this worker advertises."""
        return self.slots - self.in_flight

    def accept(self, request: Request, now: float) -> float | None:
        """Take a dispatched request; returns when to wake the worker, if it must be woken."""
        if self.in_flight >= self.slots:
            raise RuntimeError(f"{self.name} over-filled: {self.in_flight} of {self.slots} slots")
        self.in_flight += 1
        if self.service.kind == "per_request":
            end = now + self.service.a * request.cost + self.service.b
            self._running.append((end, request))
            return end
        self._waiting.append((now, request))
        return self._maybe_start(now)

    def wake(self, now: float) -> tuple[list[Request], float | None]:
        """Finish what is due at ``now``; returns the finished requests and the next wake-up."""
        done = [r for end, r in self._running if end <= now]
        if done:
            self._running = [(end, r) for end, r in self._running if end > now]
            self.in_flight -= len(done)
            if self.service.kind == "batch":
                self._batch_end, self._idle_since = None, now
        if self.service.kind == "per_request":
            return done, None
        return done, self._maybe_start(now)

    def _maybe_start(self, now: float) -> float | None:
        if self._batch_end is not None or not self._waiting:
            return None  # a batch is running: its end is already scheduled
        s = self.service
        queued = sum(r.cost for _, r in self._waiting)
        since = max(self._waiting[0][0], self._idle_since)  # the delay runs while idle
        full = queued >= s.max_batch_size or self.in_flight >= self.slots
        if not full and now < since + s.max_delay_s:
            return since + s.max_delay_s
        n = 0.0
        while self._waiting and (n == 0 or n + self._waiting[0][1].cost <= s.max_batch_size):
            _, r = self._waiting.popleft()
            n += r.cost
            self._running.append((0.0, r))
        self._batch_end = now + s.a * n + s.b
        self._running = [(self._batch_end, r) for _, r in self._running]
        return self._batch_end
