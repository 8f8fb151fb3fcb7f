"""Paired ratios of benchmark rounds: each round runs the systems back to back, so a round's
ratio cancels the machine's slower drifts; the verdict is the median of those ratios."""

from __future__ import annotations

import statistics


def verdict(label: str, per_round: list[float], goal: float, *, higher_is_better: bool) -> float:
    """Print the median of the rounds' paired ratios, their range and whether ``goal`` is met;
    returns the median."""
    ratio = statistics.median(per_round)
    met = ratio >= goal if higher_is_better else ratio <= goal
    sign = ">=" if higher_is_better else "<="
    print(f"{label}: {ratio:.3f} (rounds {min(per_round):.3f}-{max(per_round):.3f};"
          f" goal {sign} {goal}: {'met' if met else 'NOT met'})")  # fmt: skip
    return ratio
