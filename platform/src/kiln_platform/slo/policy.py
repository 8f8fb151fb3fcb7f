"""Pure SLO policy: windows scaled to the period, burn rates, error budgets, alert states.

The windows and burn rates are the Google SRE workbook's (chapter 5, "Alerting on SLOs") for a
30-day period, scaled by ``period / 30 days``: a page when both the 1h and 5m windows burn at
14.4x, or both 6h and 30m at 6x; a ticket on 1d/2h at 3x and 3d/6h at 1x.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

DAY_S = 86_400.0
WORKBOOK_PERIOD_S = 30 * DAY_S


class Sli(StrEnum):
    """What an event is judged by."""

    AVAILABILITY = "availability"
    """Good: not a server error (status < 500)."""
    LATENCY = "latency"
    """Good: faster than the threshold (time to first token for a generation)."""


@dataclass(frozen=True, slots=True)
class BurnRule:
    """One multi-window burn-rate alert, in the workbook's 30-day terms."""

    name: str
    severity: str
    long_s: float
    short_s: float
    burn: float

    def scaled(self, period_s: float) -> tuple[float, float]:
        """The (long, short) windows for an SLO over ``period_s``."""
        factor = period_s / WORKBOOK_PERIOD_S
        return self.long_s * factor, self.short_s * factor


RULES = (
    BurnRule("fast-burn", "page", 3600.0, 300.0, 14.4),
    BurnRule("slow-burn", "page", 6 * 3600.0, 1800.0, 6.0),
    BurnRule("budget-burn-1d", "ticket", DAY_S, 2 * 3600.0, 3.0),
    BurnRule("budget-burn-3d", "ticket", 3 * DAY_S, 6 * 3600.0, 1.0),
)


@dataclass(frozen=True, slots=True)
class Objective:
    """An SLO's targets (the part the policy needs)."""

    model: str
    availability: float | None
    """Fraction of requests that must not be server errors (e.g. 0.999), or None."""
    latency: float | None
    """Fraction of requests that must be faster than ``latency_ms`` (e.g. 0.99), or None."""
    latency_ms: float
    period_s: float = WORKBOOK_PERIOD_S

    def target(self, sli: Sli) -> float | None:
        """The objective for one SLI (None: not set)."""
        return self.availability if sli is Sli.AVAILABILITY else self.latency


@dataclass(frozen=True, slots=True)
class Counts:
    """Events in a window: all of them, server errors, slow ones."""

    total: int = 0
    errors: int = 0
    slow: int = 0

    def bad(self, sli: Sli) -> int:
        """The events that were bad for ``sli``."""
        return self.errors if sli is Sli.AVAILABILITY else self.slow


@dataclass(frozen=True, slots=True)
class AlertState:
    """Whether one burn-rate alert of one SLI fires, with the burn rates that decided it."""

    rule: BurnRule
    sli: Sli
    firing: bool
    long_burn: float
    short_burn: float
    at: datetime


def windows(objective: Objective) -> list[float]:
    """Every window (seconds) ``evaluate`` needs counts for, the period included."""
    spans = {w for rule in RULES for w in rule.scaled(objective.period_s)}
    return sorted({*spans, objective.period_s})


def burn_rate(counts: Counts, sli: Sli, target: float) -> float:
    """How fast the window spends the budget: its bad fraction over the allowed one."""
    if counts.total == 0:
        return 0.0
    return (counts.bad(sli) / counts.total) / (1.0 - target)


def budget_remaining(counts: Counts, sli: Sli, target: float) -> float:
    """The fraction of the period's error budget left (negative once overspent)."""
    return 1.0 - burn_rate(counts, sli, target)


def evaluate(
    counts: Mapping[float, Counts], objective: Objective, now: datetime
) -> list[AlertState]:
    """The state of every burn-rate alert of every SLI the objective sets, from the counts in
    each of ``windows(objective)`` ending at ``now``."""
    states = []
    for sli in Sli:
        target = objective.target(sli)
        if target is None:
            continue
        for rule in RULES:
            long_s, short_s = rule.scaled(objective.period_s)
            long_burn = burn_rate(counts.get(long_s, Counts()), sli, target)
            short_burn = burn_rate(counts.get(short_s, Counts()), sli, target)
            firing = long_burn > rule.burn and short_burn > rule.burn
            states.append(AlertState(rule, sli, firing, long_burn, short_burn, now))
    return states


def alerts(states: list[AlertState]) -> dict[tuple[Sli, str], bool]:
    """One alert per SLI and severity (the workbook's combined rule: a page fires when either
    of its two window pairs does), and whether it fires."""
    fired: dict[tuple[Sli, str], bool] = {}
    for state in states:
        key = (state.sli, state.rule.severity)
        fired[key] = fired.get(key, False) or state.firing
    return fired
