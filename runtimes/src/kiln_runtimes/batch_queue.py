"""Deadline-aware dynamic batching decisions: pure, read off an injectable clock, no I/O.

``BatchQueue`` decides and never sleeps. A batch closes when it holds ``max_batch_size`` items,
when its oldest item has waited ``max_wait`` seconds, or early when the tightest deadline's slack
is no more than the predicted execution time of the batch at its current size; with ``adaptive``
it closes at once (``alone``) when the arrival rate says no company comes in time or waiting for
it would cost more than it saves (``_arrivals``). Queued items whose deadline can no longer be
met (``now + t(1) > deadline``) are expired, also while a batch runs.
Express requests (the gateway's express lane) queue ahead of normal ones, behind earlier express
ones, and a batch never mixes the two. Express batches have a runner of their own beyond
``concurrency`` (``express_lane``; not with ``prefetch``): one starts at once beside running
normal batches, and no normal batch starts while it runs. When every runner is busy, an express
request also *preempts* a normal batch that has at least as long left to run as it has run (so
the work thrown away is never more than the wait saved): the backend stops it at its next
operator and its items go back to the head of the normal queue, marked so that they are not
stopped twice. With ``prefetch`` a full normal batch may also close while every runner is busy
(one per runner, only if its deadlines survive the wait), so a runner never waits for the event
loop between batches; express arrivals stop those for free. ``batcher.Batcher`` drives a queue.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from kiln_runtimes._arrivals import ArrivalRate, worth_waiting
from kiln_runtimes._attribution import shares
from kiln_runtimes._batch_types import Batch, BatchResult, CloseReason, Item, Outcome, Ticket
from kiln_runtimes._errors import DeadlineExceeded, Internal, Overloaded, WorkerError
from kiln_runtimes._latency import LatencyModel

Clock = Callable[[], float]


@dataclass(frozen=True, slots=True)
class BatchPolicy:
    """The knobs: items per batch, seconds the oldest item may wait at most, items the queue
    holds, how many batches run at once, whether express requests preempt normal batches, whether
    a full batch may be closed ahead of a free runner (``prefetch``, at most one per runner), and
    whether a partial batch waits only for company that is expected (``adaptive``)."""

    max_batch_size: int = 32
    max_wait: float = 0.005
    max_queue: int = 1024
    concurrency: int = 1
    preempt: bool = True
    prefetch: bool = False
    adaptive: bool = True
    """Wait for company only when the arrival rate says it comes in time and pays
    (``_arrivals.worth_waiting``); off: every partial batch waits ``max_wait``."""
    express_lane: bool = True
    """One runner beyond ``concurrency`` for express batches (not with ``prefetch``)."""

    @property
    def express_runner(self) -> bool:
        """Whether express batches have a runner of their own (``runners`` counts it)."""
        return self.express_lane and not self.prefetch

    @property
    def runners(self) -> int:
        """Threads the driver needs: ``concurrency``, plus the express runner."""
        return self.concurrency + self.express_runner


def close_reason(
    policy: BatchPolicy,
    model: LatencyModel,
    now: float,
    *,
    size: int,
    oldest_enqueued_at: float,
    tightest_deadline: float | None,
    next_arrival: float | None = None,
) -> CloseReason | None:
    """Decide whether a candidate batch of ``size >= 1`` items closes now; ``next_arrival`` is
    the seconds until the next request is expected (``_arrivals``; ``None``: unknown)."""
    if size >= policy.max_batch_size:
        return "size"
    if tightest_deadline is not None and tightest_deadline - now <= model.predict(size):
        return "deadline"
    waited = now - oldest_enqueued_at
    if waited >= policy.max_wait:
        return "wait"
    if policy.adaptive and not worth_waiting(
        model, size=size, waited=waited, budget=policy.max_wait, gap=next_arrival
    ):
        return "alone"
    return None


@dataclass(slots=True)
class BatchQueue:
    """FIFO items (express ones first), at most ``policy.concurrency`` running batches, and the
    decisions about both."""

    policy: BatchPolicy
    clock: Clock
    model: LatencyModel = field(default_factory=LatencyModel)
    running: list[Batch] = field(default_factory=list)
    _items: deque[Item] = field(default_factory=deque)
    _stopping: list[Batch] = field(default_factory=list)
    _waiting: Counter[Ticket] = field(default_factory=Counter)
    """Queued items per ticket, so deadline scans cost one step per request, not per item."""
    _ahead: list[Batch] = field(default_factory=list)
    """Prefetched batches (also in ``running``) that no runner has taken yet, oldest first."""
    _began: dict[int, float] = field(default_factory=dict)
    """When a prefetched batch started (the runner before it finished), by ``id``."""
    _arrivals: ArrivalRate = field(default_factory=ArrivalRate)

    @property
    def queued(self) -> int:
        """Items waiting (not counting the running batch)."""
        return len(self._items)

    def submit(
        self,
        request_id: str,
        inputs: Sequence[Any],
        time_budget: float | None,
        *,
        express: bool = False,
    ) -> Ticket:
        """Enqueue a request's inputs, or raise ``Overloaded`` if the queue cannot hold them.

        ``express`` inputs go ahead of every queued normal input, behind earlier express ones.
        """
        if len(self._items) + len(inputs) > self.policy.max_queue:
            batches = math.ceil((len(self._items) + len(inputs)) / self.policy.max_batch_size)
            drain = batches * self.model.predict(self.policy.max_batch_size)
            raise Overloaded("worker queue is full", retry_after_s=round(drain, 3))
        now = self.clock()
        self._arrivals.observe(now)
        deadline = None if time_budget is None else now + time_budget
        n = len(inputs)
        ticket = Ticket(request_id, n, now, deadline, [None] * n, n, express=express)
        items = [Item(ticket, i, ids) for i, ids in enumerate(inputs)]
        if express:
            self._insert(self._express_queued(), items)
        else:
            self._items.extend(items)
            self._waiting[ticket] += n
        return ticket

    def preempt(self) -> list[Batch]:
        """The batches to stop so that the express items at the head can run (maybe none).

        Only when every runner is busy and no stop is pending: a started normal batch never
        stopped before that has at least as long left to run (by the latency model) as it has
        run, and every prefetched normal batch no runner has taken (stopping those costs
        nothing). The driver stops them; their outcomes come back to ``requeue``.
        """
        if not self.policy.preempt or self._free() or self._stopping:
            return []
        if not self._items or not self._items[0].ticket.express:
            return []
        now = self.clock()

        def left(batch: Batch) -> float:
            return self._start(batch) + self.model.predict(len(batch.items)) - now

        started = [
            b for b in self._started()
            if not b.express and b.preemptible and left(b) >= now - self._start(b)
        ]  # fmt: skip
        victims = list(self._ahead)  # only full normal batches are prefetched
        if started:
            victims.append(max(started, key=left))
        self._stopping += victims
        return victims

    def requeue(self, batch: Batch) -> None:
        """Take a stopped batch off the runners; its unsettled items go back to the head of the
        normal queue (behind express items), in order, marked as preempted."""
        self._forget(batch)
        items = [replace(i, preempted=True) for i in batch.items if not i.ticket.settled]
        self._insert(self._express_queued(), items)

    def poll(self) -> tuple[Batch | None, list[Ticket]]:
        """Expire what cannot meet its deadline, then close a batch if a runner is free and one
        is due."""
        now = self.clock()
        expired = self._settle(self._late(now), DeadlineExceeded, "deadline can no longer be met")
        if not self._items:
            return None, expired
        candidate = list(self._candidate())
        ahead = not self._free(candidate[0].ticket.express)
        if ahead:
            reason: CloseReason | None = "size" if self._may_prefetch(candidate, now) else None
        else:
            reason = close_reason(
                self.policy,
                self.model,
                now,
                size=len(candidate),
                oldest_enqueued_at=candidate[0].ticket.enqueued_at,
                tightest_deadline=_tightest(candidate),
                next_arrival=self._arrivals.expected_gap(now),
            )
        if reason is None:
            return None, expired
        for item in candidate:
            self._items.popleft()
            self._dequeued(item.ticket)
        batch = Batch(tuple(candidate), reason, now)
        self.running.append(batch)
        if ahead:  # its requests start when a runner takes it (``_forget``)
            self._ahead.append(batch)
        else:
            _started_at(batch, now)
        return batch, expired

    def next_wakeup(self) -> float | None:
        """The clock time at which ``poll`` may next decide something without new input."""
        t1 = self.model.predict(1)
        times = [t.deadline - t1 for t in self._waiting if t.deadline is not None]
        if self._items and self._free(self._items[0].ticket.express):
            candidate = list(self._candidate())
            times.append(candidate[0].ticket.enqueued_at + self.policy.max_wait)
            tightest = _tightest(candidate)
            if tightest is not None:
                times.append(tightest - self.model.predict(len(candidate)))
        return min(times, default=None)

    def finish(self, running: Batch, outcomes: Iterable[Outcome]) -> list[Ticket]:
        """Record the outcomes of the ``running`` batch (its parts' if it was split); return the
        tickets that settled."""
        self._forget(running)
        settled: list[Ticket] = []
        for outcome in outcomes:
            rows, batch = outcome.result, outcome.batch
            if isinstance(rows, Exception) or not _well_formed(rows, len(batch.items)):
                message = f"backend failed: {rows!r}"[:300]
                settled += self._settle(batch.tickets(), Internal, message)
                continue
            self.model.observe(len(batch.items), outcome.seconds)
            seconds = shares(batch.costs(), outcome.seconds)
            for item, row, share in zip(batch.items, rows, seconds, strict=True):
                ticket = item.ticket
                if not ticket.settled:
                    ticket.compute_s += share
                    ticket.batch_size = max(ticket.batch_size, len(batch.items))
                    ticket.rows[item.index] = row
                    ticket.pending -= 1
                    if ticket.pending == 0:
                        ticket.finished_at = self.clock()
                        settled.append(ticket)
        return settled

    def _forget(self, batch: Batch) -> None:
        """Take a batch that came back off the runners; a started one's runner takes the oldest
        prefetched batch next."""
        self.running = [b for b in self.running if b is not batch]
        self._stopping = [b for b in self._stopping if b is not batch]
        self._began.pop(id(batch), None)
        waiting = [b for b in self._ahead if b is not batch]
        if len(waiting) < len(self._ahead):
            self._ahead = waiting
        elif self._ahead:
            taken = self._ahead.pop(0)
            self._began[id(taken)] = self.clock()
            _started_at(taken, self._began[id(taken)])

    def _started(self) -> list[Batch]:
        ahead = {id(b) for b in self._ahead}
        return [b for b in self.running if id(b) not in ahead]

    def _start(self, batch: Batch) -> float:
        return self._began.get(id(batch), batch.started_at)

    def _may_prefetch(self, candidate: list[Item], now: float) -> bool:
        """Whether to close ``candidate`` while every runner is busy: only a full normal batch,
        one per runner, none while a stop is pending, and only if its tightest deadline survives
        waiting for the earliest predicted end of a running batch (nothing it holds can expire
        because it left the queue early)."""
        policy = self.policy
        if not policy.prefetch or len(self._ahead) >= policy.concurrency or self._stopping:
            return False
        if len(candidate) < policy.max_batch_size or candidate[0].ticket.express:
            return False
        tightest = _tightest(candidate)
        if tightest is None:
            return True
        ends = [self._start(b) + self.model.predict(len(b.items)) for b in self._started()]
        return tightest - self.model.predict(len(candidate)) >= max(min(ends, default=now), now)

    def _insert(self, at: int, items: list[Item]) -> None:
        """Put ``items`` into the queue before position ``at``."""
        for item in items:
            self._waiting[item.ticket] += 1
        self._items.rotate(-at)
        self._items.extendleft(reversed(items))
        self._items.rotate(at)

    def _free(self, express: bool = False) -> bool:
        """Whether a batch of the kind may start: a normal one on a normal runner (none while an
        express batch has the express runner), an express one on the express runner."""
        if not self.policy.express_runner:
            return len(self.running) - len(self._ahead) < self.policy.concurrency
        started = self._started()
        fast = sum(b.express for b in started)
        if express:
            return not fast and len(started) <= self.policy.concurrency
        return not fast and len(started) < self.policy.concurrency

    def _express_queued(self) -> int:
        n = 0
        for item in self._items:
            if not item.ticket.express:
                break
            n += 1
        return n

    def _candidate(self) -> Iterator[Item]:
        express = self._items[0].ticket.express
        for n, item in enumerate(self._items):
            if n == self.policy.max_batch_size or item.ticket.express is not express:
                return
            yield item

    def _late(self, now: float) -> list[Ticket]:
        t1 = self.model.predict(1)
        return [t for t in self._waiting if t.deadline is not None and now + t1 > t.deadline]

    def _dequeued(self, ticket: Ticket) -> None:
        self._waiting[ticket] -= 1
        if not self._waiting[ticket]:
            del self._waiting[ticket]

    def _settle(
        self, tickets: list[Ticket], error: type[WorkerError], message: str
    ) -> list[Ticket]:
        """Fail whole tickets and drop their queued items, so none is half answered."""
        failed = [t for t in tickets if not t.settled]
        now = self.clock()
        for ticket in failed:
            ticket.error, ticket.finished_at = error(message), now
        if failed:
            self._items = deque(i for i in self._items if not i.ticket.settled)
            for ticket in failed:
                self._waiting.pop(ticket, None)
        return failed


def _well_formed(rows: BatchResult, size: int) -> bool:
    """float32 rows ``[size, d]``, or a list of ``size`` per-item results (tensor models)."""
    if isinstance(rows, np.ndarray):
        return rows.ndim == 2 and len(rows) == size
    return isinstance(rows, list) and len(rows) == size


def _started_at(batch: Batch, now: float) -> None:
    """Mark the requests of a batch a runner takes as started (once: a request may span several
    batches)."""
    for item in batch.items:
        if item.ticket.started_at is None:
            item.ticket.started_at = now


def _tightest(items: Iterable[Item]) -> float | None:
    return min((i.ticket.deadline for i in items if i.ticket.deadline is not None), default=None)
