"""Cold starts of pools at zero, timed by phase (``kiln_cold_start_phase_seconds``).

A cold start begins when a request arrives at a pool with no worker and ends with the first
response of that pool's new worker. Its five phases add up to the wait the request saw:

- ``scheduling``: the request's arrival at the gateway (its authentication and tokenizing
  included) -> the backend starts the worker (the manager's decision);
- ``process_start``: a process spawned or a warm standby adopted, its listener up, and the
  gateway's readiness check seeing it ready: what is left of start -> ready once the worker's
  own load and warm-up are taken out;
- ``model_load`` and ``warmup``: as the worker measured them (``WorkerInfo.load_s``,
  ``warmup_s``);
- ``first_response``: ready -> the response of the first request the pool completes is sent
  (its wait in the fair queue, the worker's run, the gateway's encoding).

Each phase is observed once per cold start, when it ends; a pool that was started without a
request waiting (a new version, a restart after a crash) is not a cold start.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import Counter, Histogram

from kiln_platform.observability import after_response

if TYPE_CHECKING:
    from kiln_platform.pools.backend import PoolWorker

ABANDONED_S = 120.0
"""A start from zero unfinished for this long (``KILN_WORKER_START_TIMEOUT_S``'s default) is
over: a new arrival begins another."""
PHASES = ("scheduling", "process_start", "model_load", "warmup", "first_response")

PHASE_SECONDS = Histogram(
    "kiln_cold_start_phase_seconds",
    "Seconds each phase of a pool's start from zero took (once per cold start).",
    ["model", "version", "phase"],
    buckets=(0.001, 0.005, 0.025, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120, 300),
)
COLD_STARTS = Counter(
    "kiln_cold_starts", "Pools started from zero by a waiting request.", ["model", "version"]
)


@dataclass(slots=True)
class _Start:
    arrived: float
    ready: float | None = None
    phases: dict[str, float] | None = None


def start_phases(
    arrived: float, started: float, ready: float, load_s: float, warmup_s: float
) -> dict[str, float]:
    """The phases up to readiness (monotonic seconds; ``load_s``/``warmup_s`` the worker's)."""
    return {
        "scheduling": max(started - arrived, 0.0),
        "process_start": max(ready - started - load_s - warmup_s, 0.0),
        "model_load": load_s,
        "warmup": warmup_s,
    }


class ColdStarts:
    """Follows each pool's start from zero and observes its phases."""

    def __init__(self) -> None:
        self._starts: dict[str, _Start] = {}
        self._now = time.monotonic
        self.done: collections.Counter[str] = collections.Counter()
        """Cold starts completed per pool since the gateway started (the console's fleet view;
        ``kiln_cold_starts`` counts the same ones)."""

    def arrived(self, pool: str, since: float | None = None) -> None:
        """A request (that reached the gateway at ``since``) arrived at ``pool`` with no worker.

        A start still unfinished (its worker taken away before it was ready) goes on: requests
        have waited since it began. One older than ``ABANDONED_S`` was given up and is replaced.
        """
        now = self._now()
        start = self._starts.get(pool)
        if start is None or start.ready is not None or now - start.arrived > ABANDONED_S:
            self._starts[pool] = _Start(now if since is None else since)

    def ready(self, worker: PoolWorker) -> None:
        """A worker became ready: if its pool is starting from zero, the start phases end."""
        start = self._starts.get(worker.spec.key)
        if start is None or start.ready is not None or worker.info is None:
            return
        start.ready = now = self._now()
        info = worker.info
        start.phases = start_phases(
            start.arrived, worker.started_at, now, info.load_s, info.warmup_s
        )
        for phase, seconds in start.phases.items():
            PHASE_SECONDS.labels(worker.spec.model, worker.spec.label, phase).observe(seconds)

    def responded(self, model: str, version: str, pool: str) -> None:
        """A request on ``pool`` completed: the first one after readiness ends its cold start."""
        start = self._starts.get(pool)
        if start is None or start.ready is None:
            return
        del self._starts[pool]
        self.done[pool] += 1
        ready = start.ready

        def sent() -> None:
            PHASE_SECONDS.labels(model, version, "first_response").observe(self._now() - ready)
            COLD_STARTS.labels(model, version).inc()

        after_response(sent)
