"""Compute time attributed to requests (pure): a batch's time shared by its members' cost."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import TypeVar

K = TypeVar("K", bound=Hashable)


def shares(costs: Sequence[float], seconds: float) -> list[float]:
    """Split ``seconds`` among members in proportion to their cost (equally if all cost 0)."""
    total = sum(costs)
    if total <= 0:
        return [seconds / len(costs)] * len(costs) if costs else []
    return [seconds * c / total for c in costs]


def shares_by(costs: Mapping[K, float], seconds: float) -> dict[K, float]:
    """``shares`` keyed by member."""
    return dict(zip(costs, shares(list(costs.values()), seconds), strict=True))
