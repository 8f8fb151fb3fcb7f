"""The rollout decision, a pure function: one step's canary and stable figures -> hold,
promote, complete or roll back (``decide``), and the worst-case failures a plan lets through
(``failure_bound``).

- **Roll back** at once when the sequential error test (``registry.sequential``) says the
  canary fails more often, without waiting for the step's minimum;
- at the step's end (its minimum of canary requests and of time both reached) roll back if the
  canary's error rate exceeds the stable's by more than ``max_error_excess``, its p99 latency
  is more than ``max_latency_ratio`` times the stable's, or its share of empty or truncated
  generations exceeds the stable's by more than ``max_degenerate_excess``;
- roll back a canary that served none of its step's draws for ``progress_deadline_s`` while
  some were made (each served by the stable version because the canary's pool was not ready);
- else **promote** to the next step, or **complete** (the canary made stable) after the last
  step below 100 %.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from kiln_platform.registry import sequential

if TYPE_CHECKING:
    from kiln_platform.registry.schemas import RolloutPlan

BUCKET_BASE_S = 0.001
BUCKET_GROWTH = 1.1
BUCKETS = 128
"""Latency histogram: bucket ``i`` holds latencies up to ``1 ms * 1.1**i`` (the last, above)."""


def bucket(latency_s: float) -> int:
    """The histogram bucket of one latency."""
    if latency_s <= BUCKET_BASE_S:
        return 0
    return min(BUCKETS - 1, math.ceil(math.log(latency_s / BUCKET_BASE_S, BUCKET_GROWTH)))


@dataclass(slots=True)
class Arm:
    """One version's requests in one step: counts and a latency histogram."""

    total: int = 0
    errors: int = 0
    degenerate: int = 0
    """Generations that came back empty or cut at their length limit."""
    latency: list[int] = field(default_factory=lambda: [0] * BUCKETS)

    def add(self, other: Arm) -> None:
        """Add another gateway's counts of the same arm."""
        self.total, self.errors = self.total + other.total, self.errors + other.errors
        self.degenerate += other.degenerate
        self.latency = [a + b for a, b in zip(self.latency, other.latency, strict=True)]

    def rate(self, count: int) -> float:
        """``count`` over the requests (0 without requests)."""
        return count / self.total if self.total else 0.0

    def p99_ms(self) -> float:
        """The 99th percentile latency, as its bucket's upper bound (0 without requests)."""
        seen, need = 0, 0.99 * sum(self.latency)
        for i, n in enumerate(self.latency):
            seen += n
            if n and seen >= need:
                return round(BUCKET_BASE_S * BUCKET_GROWTH**i * 1000, 3)
        return 0.0

    def summary(self) -> dict[str, Any]:
        """The figures a decision records."""
        return {"requests": self.total, "errors": self.errors,
                "error_rate": round(self.rate(self.errors), 5), "degenerate": self.degenerate,
                "p99_ms": self.p99_ms()}  # fmt: skip


class Action(StrEnum):
    """What to do with a rollout now."""

    HOLD = "hold"
    PROMOTE = "promote"
    COMPLETE = "complete"
    ROLLBACK = "rollback"


@dataclass(frozen=True, slots=True)
class Decision:
    """An action, why, and the figures it was made on."""

    action: Action
    reason: str
    figures: dict[str, Any]


def decide(
    plan: RolloutPlan, step: int, canary: Arm, stable: Arm, elapsed_s: float, *, deferred: int = 0
) -> Decision:
    """The decision for step index ``step`` after ``elapsed_s`` seconds of it, ``deferred``
    of the canary's draws having been served by the stable version (its pool not ready)."""
    share = plan.steps[step] / 100 if plan.split == "request" else None  # known when drawn
    verdict = sequential.sprt(canary.total, canary.errors, stable.total, stable.errors,
                              alpha=plan.alpha, ratio=plan.error_ratio, share=share)  # fmt: skip
    figures = {
        "percent": plan.steps[step], "elapsed_s": round(elapsed_s, 3),
        "canary": canary.summary(), "stable": stable.summary(),
        "llr": round(verdict.llr, 4), "threshold": round(verdict.threshold, 4),
        "share": round(verdict.share, 4), "alpha": plan.alpha, "error_ratio": plan.error_ratio,
        "deferred": deferred,
    }  # fmt: skip
    if verdict.worse:
        return Decision(Action.ROLLBACK, "error rate: the sequential test rejects", figures)
    if deferred and not canary.total and elapsed_s >= plan.progress_deadline_s:
        return Decision(Action.ROLLBACK, "the canary was not ready within progress_deadline_s",
                        figures)  # fmt: skip
    if canary.total < plan.min_requests or elapsed_s < plan.min_seconds:
        return Decision(Action.HOLD, "step minimum not reached", figures)
    breach = _step_end_breach(plan, canary, stable)
    if breach is not None:
        return Decision(Action.ROLLBACK, breach, figures)
    if plan.steps[step + 1] >= 100:
        return Decision(Action.COMPLETE, "last step passed: the canary is stable", figures)
    return Decision(Action.PROMOTE, f"step passed: {plan.steps[step + 1]} %", figures)


def _step_end_breach(plan: RolloutPlan, canary: Arm, stable: Arm) -> str | None:
    """Which of the step-end bounds the canary breaks, if any."""
    if canary.rate(canary.errors) - stable.rate(stable.errors) > plan.max_error_excess:
        return "error rate above the stable's by more than max_error_excess"
    degenerate = canary.rate(canary.degenerate) - stable.rate(stable.degenerate)
    if degenerate > plan.max_degenerate_excess:
        return "empty or truncated outputs above the stable's by more than max_degenerate_excess"
    if stable.total and canary.p99_ms() > plan.max_latency_ratio * stable.p99_ms():
        return "p99 latency above max_latency_ratio times the stable's"
    return None


def failure_bound(plan: RolloutPlan) -> int:
    """The most canary failures the sequential test lets through over the whole rollout while
    the stable version has none: per step, one less than the failures that make it reject (a
    step promoted with that many) -- except the step that rejects, at its last one."""
    per_step = [
        sequential.failures_to_reject(p / 100, alpha=plan.alpha, ratio=plan.error_ratio)
        for p in plan.steps if p < 100
    ]  # fmt: skip
    return sum(n - 1 for n in per_step) + 1
