"""The rollout decision (``registry.rollout_policy.decide``): roll back at once when the test
rejects, hold until the step's minimum, check the step-end bounds, promote, complete."""

from __future__ import annotations

import pytest

from kiln_platform.registry.rollout_policy import Action, Arm, bucket, decide, failure_bound
from kiln_platform.registry.schemas import RolloutPlan
from kiln_platform.registry.sequential import failures_to_reject

pytestmark = pytest.mark.unit

PLAN = RolloutPlan(steps=[10, 50, 100], split="request", min_requests=100, min_seconds=5.0)


def arm(total: int, errors: int = 0, latency_s: float = 0.01, degenerate: int = 0) -> Arm:
    made = Arm(total, errors, degenerate)
    made.latency[bucket(latency_s)] = total
    return made


def test_rollback_as_soon_as_the_test_rejects_before_the_minimum() -> None:
    got = decide(PLAN, 0, arm(40, 6), arm(360), elapsed_s=0.5)
    assert got.action is Action.ROLLBACK
    assert got.figures["canary"]["errors"] == 6
    assert got.figures["llr"] >= got.figures["threshold"]
    assert got.figures["share"] == 0.1


def test_hold_until_the_minimum_of_requests_and_time() -> None:
    assert decide(PLAN, 0, arm(99), arm(900), elapsed_s=60).action is Action.HOLD
    assert decide(PLAN, 0, arm(100), arm(900), elapsed_s=4.9).action is Action.HOLD


def test_promote_then_complete() -> None:
    got = decide(PLAN, 0, arm(100), arm(900), elapsed_s=5)
    assert (got.action, got.figures["percent"]) == (Action.PROMOTE, 10)
    assert decide(PLAN, 1, arm(100), arm(100), elapsed_s=5).action is Action.COMPLETE


@pytest.mark.parametrize(
    ("canary", "reason"),
    [
        (arm(200, errors=3), "error rate"),
        (arm(200, latency_s=0.5), "p99 latency"),
        (arm(200, degenerate=20), "empty or truncated"),
    ],
)
def test_step_end_bounds(canary: Arm, reason: str) -> None:
    got = decide(PLAN, 1, canary, arm(200, latency_s=0.1), elapsed_s=5)
    assert got.action is Action.ROLLBACK
    assert got.reason.startswith(reason)


def test_a_canary_never_ready_is_rolled_back_at_the_progress_deadline() -> None:
    """Draws kept on stable (the canary's pool not ready) hold the step until the deadline;
    a canary that served, or drew nothing, is not rolled back for it."""
    plan = RolloutPlan(steps=[10, 100], min_requests=100, min_seconds=5.0, progress_deadline_s=60)
    assert decide(plan, 0, arm(0), arm(900), elapsed_s=59.9, deferred=90).action is Action.HOLD
    got = decide(plan, 0, arm(0), arm(900), elapsed_s=60, deferred=90)
    assert (got.action, got.figures["deferred"]) == (Action.ROLLBACK, 90)
    assert "progress_deadline_s" in got.reason
    assert decide(plan, 0, arm(0), arm(900), elapsed_s=600).action is Action.HOLD  # no draws
    late = decide(plan, 0, arm(50), arm(900), elapsed_s=600, deferred=90)  # ready, but slow
    assert late.action is Action.HOLD


def test_p99_is_the_bucket_bound() -> None:
    a = Arm()
    for ms in range(1, 101):
        a.latency[bucket(ms / 1000)] += 1
        a.total += 1
    assert 99 <= a.p99_ms() <= 99 * 1.1


def test_failure_bound_sums_the_steps() -> None:
    per_step = [failures_to_reject(p, alpha=0.05, ratio=2.0) for p in (0.1, 0.5)]
    assert failure_bound(PLAN) == per_step[0] - 1 + per_step[1] - 1 + 1
