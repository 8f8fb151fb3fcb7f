"""The batcher: drives a ``batch_queue.BatchQueue`` on the event loop and runs its batches on a
backend, ``concurrency`` batches at a time, each on its own thread (on CPU: one core each, so a
batch that loses its core to another process delays only itself, and one batch fills while
another runs). Express requests stop the batches the queue picks (``Stop``); a batch that fails
with several requests in it runs again one request at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import structlog

from kiln_runtimes._batch_types import BatchResult, Outcome
from kiln_runtimes._latency import LatencyModel
from kiln_runtimes.batch_queue import BatchPolicy, BatchQueue, Clock
from kiln_runtimes.cpus import pin_thread

if TYPE_CHECKING:
    from kiln_runtimes._batch_types import Batch, Ticket
    from kiln_runtimes.backends.base import Stop

log = structlog.get_logger(__name__)

Run = Callable[[list[Any], Any], BatchResult]
"""A backend's ``run(inputs, stop)``; ``stop`` is a ``Stop`` or ``None``."""


class Batcher:
    """Drives a ``BatchQueue`` on the event loop; ``run`` executes on ``concurrency`` threads
    (on ``cpus`` if given).

    ``stopper`` makes a fresh ``Stop`` for each run (the backend's); without one, nothing is
    preempted.
    """

    def __init__(
        self,
        run: Run,
        policy: BatchPolicy,
        *,
        stopper: Callable[[], Stop] | None = None,
        clock: Clock = time.monotonic,
        model: LatencyModel | None = None,
        on_batch: Callable[[Outcome], None] | None = None,
        cpus: frozenset[int] | None = None,
    ) -> None:
        if stopper is None:
            policy = replace(policy, preempt=False)
        self.queue = BatchQueue(policy, clock, model or LatencyModel())
        self._run, self._stopper, self._clock, self._on_batch = run, stopper, clock, on_batch
        self._stops: dict[int, Stop] = {}
        self._waiters: dict[Ticket, asyncio.Future[None]] = {}
        self._wake = asyncio.Event()
        self._executor = ThreadPoolExecutor(
            policy.runners, "kiln-batch", initializer=pin_thread, initargs=(cpus,)
        )
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        """Start the scheduling loop on the running event loop."""
        self._spawn(self._loop())

    async def submit(
        self,
        request_id: str,
        inputs: Sequence[Any],
        time_budget: float | None,
        *,
        express: bool = False,
    ) -> Ticket:
        """Queue one request's inputs and wait until all of them have run; errors raise.

        ``time_budget`` is the seconds from now to the request's deadline (``None``: no deadline);
        ``express`` puts them ahead of queued normal requests, in batches of their own.
        """
        ticket = self.queue.submit(request_id, inputs, time_budget, express=express)
        waiter = self._waiters[ticket] = asyncio.get_running_loop().create_future()
        for victim in self.queue.preempt() if express else []:
            self._stops[id(victim)].terminate = True
        self._wake.set()
        await waiter
        if ticket.error is not None:
            raise ticket.error
        return ticket

    async def close(self) -> None:
        """Stop the loop and the worker thread (call once nothing is queued)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._executor.shutdown(wait=True)

    async def _loop(self) -> None:
        while True:
            self._wake.clear()
            batch, expired = self.queue.poll()
            self._resolve(expired)
            if batch is not None:
                stop = self._stopper() if self._stopper is not None else None
                if stop is not None:
                    self._stops[id(batch)] = stop
                self._spawn(self._execute(batch, stop))
            wakeup = self.queue.next_wakeup()
            delay = None if wakeup is None else max(wakeup - self._clock(), 0.0)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._wake.wait()

    async def _execute(self, batch: Batch, stop: Stop | None) -> None:
        loop = asyncio.get_running_loop()
        try:
            outcomes = await loop.run_in_executor(self._executor, self._run_isolated, batch, stop)
        finally:
            self._stops.pop(id(batch), None)
        if outcomes[0].preempted:
            log.info("batch preempted", size=len(batch.items), seconds=outcomes[0].seconds)
            if self._on_batch is not None:
                self._on_batch(outcomes[0])
            self.queue.requeue(batch)
            self._wake.set()
            return
        for outcome in outcomes:
            request_ids = [t.request_id for t in outcome.batch.tickets()]
            if isinstance(outcome.result, Exception):
                log.error("batch failed", request_ids=request_ids, exc_info=outcome.result)
            else:
                log.debug(
                    "batch done",
                    request_ids=request_ids,
                    size=len(outcome.batch.items),
                    reason=batch.reason,
                    seconds=round(outcome.seconds, 6),
                )
            if self._on_batch is not None:
                self._on_batch(outcome)
        self._resolve(self.queue.finish(batch, outcomes))
        self._wake.set()

    def _run_isolated(self, batch: Batch, stop: Stop | None) -> list[Outcome]:
        """Run a batch; if it fails with several requests in it, rerun each alone. A run that
        fails after ``stop`` was set was preempted."""
        outcome = self._timed(batch, stop)
        if isinstance(outcome.result, Exception) and stop is not None and stop.terminate:
            return [replace(outcome, preempted=True)]
        if isinstance(outcome.result, Exception) and len(batch.tickets()) > 1:
            return [self._timed(part, None) for part in batch.split()]
        return [outcome]

    def _timed(self, batch: Batch, stop: Stop | None) -> Outcome:
        start = self._clock()
        try:
            result: BatchResult | Exception = self._run(batch.inputs, stop)
        except Exception as exc:
            result = exc
        return Outcome(batch, result, self._clock() - start)

    def _resolve(self, tickets: list[Ticket]) -> None:
        for ticket in tickets:
            waiter = self._waiters.pop(ticket, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._forget)

    def _forget(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("batcher task crashed", exc_info=task.exception())
