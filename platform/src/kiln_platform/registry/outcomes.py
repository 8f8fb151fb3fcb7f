"""Each finished request's outcome, counted for the model's running rollout (in memory).

The hot path adds to a dict (no I/O): per rollout, step and arm (``canary`` or ``stable``) the
requests, server errors (5xx: engine failures included), empty or truncated generations and a
latency histogram. ``RolloutMonitor`` stores this gateway's counts (one row per gateway, step
and arm, overwritten) every tick; a canary's server error wakes it at once."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from dataclasses import dataclass

from kiln_platform.registry.rollout_policy import Arm, bucket

ArmKey = tuple[uuid.UUID, int, str]
"""(rollout, step index, ``canary``, ``stable`` or ``deferred``: the canary's draws served by the
stable version while its pool started, only ``total`` counted)."""


@dataclass(frozen=True, slots=True)
class Watched:
    """A running rollout as the recorder needs it."""

    rollout: uuid.UUID
    model: str
    step: int
    stable: str
    canary: str


class RolloutOutcomes:
    """Counts the requests of the models with a running rollout, per step and arm."""

    def __init__(self) -> None:
        self._watched: dict[str, Watched] = {}
        self._arms: dict[ArmKey, Arm] = {}
        self.failed = asyncio.Event()
        """Set by a canary's server error (the monitor evaluates at once)."""

    def watch(self, rollouts: list[Watched]) -> None:
        """Replace the rollouts counted for; counts of steps no longer running are dropped."""
        self._watched = {w.model: w for w in rollouts}
        steps = {(w.rollout, w.step) for w in rollouts}
        self._arms = {k: v for k, v in self._arms.items() if (k[0], k[1]) in steps}

    def observe(
        self, model: str, version: str, status: int, latency_s: float, degenerate: bool
    ) -> None:
        """One finished request (4xx, the client's doing, is not the version's: not counted)."""
        watched = self._watched.get(model)
        if watched is None or 400 <= status < 500:
            return
        if version == watched.canary:
            name = "canary"
        elif version == watched.stable:
            name = "stable"
        else:
            return
        arm = self._arms.setdefault((watched.rollout, watched.step, name), Arm())
        failed = status >= 500
        arm.total += 1
        arm.errors += failed
        arm.degenerate += degenerate
        arm.latency[bucket(latency_s)] += 1
        if failed and name == "canary":
            self.failed.set()

    def deferred(self, model: str) -> None:
        """A draw of ``model``'s canary served by its stable version while the canary's pool was
        starting (``Resolver.resolve``): evidence of neither arm, but demand the canary did not
        meet (``RolloutPlan.progress_deadline_s``)."""
        watched = self._watched.get(model)
        if watched is not None:
            self._arms.setdefault((watched.rollout, watched.step, "deferred"), Arm()).total += 1

    def snapshot(self) -> dict[ArmKey, Arm]:
        """This gateway's counts so far, per running step and arm (copies)."""
        return {k: dataclasses.replace(v, latency=list(v.latency)) for k, v in self._arms.items()}
