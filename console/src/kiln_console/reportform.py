"""The costs page's form and sums (pure): period presets, grouping checkboxes, the tenant filter,
and the totals and subtotals of the report's rows, added exactly as the CSV's columns are."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import date
from decimal import Decimal
from typing import Any
from urllib.parse import urlencode

from kiln_platform.reports.formats import money, quantity

PERIODS = ("this-month", "last-month", "custom")
CHOICES = ("tenant", "model", "version", "adapter", "key", "day")
"""The grouping checkboxes, in the order the table shows them (``request`` is the API's)."""
DEFAULT = ("tenant", "model")
MONTH, DAY = "Month", "Day"
"""The console's own columns of a row: its tenant-local month (``YYYY-MM``) and, grouped by day,
date (``YYYY-MM-DD``); the billing and charge periods' starts are instants, whose UTC dates are
the day before east of UTC."""
SUBTOTAL = {"tenant": "BillingAccountName", "model": "x_Model", "day": DAY}
"""The columns subtotals are keyed by: the first of these the report groups by."""


def month_of(day: date, back: int = 0) -> tuple[date, date]:
    """``[first, next first)`` of the month ``back`` months before ``day``'s (UTC)."""
    index = day.year * 12 + day.month - 1 - back
    first = date(index // 12, index % 12 + 1, 1)
    index += 1
    return first, date(index // 12, index % 12 + 1, 1)


@dataclass(frozen=True)
class Form:
    """What the costs form asked for, defaults filled in."""

    period: str
    start: str
    end: str
    groups: tuple[str, ...]
    tenant: str = ""

    @property
    def group_by(self) -> str:
        """The API's ``group_by``."""
        return ",".join(self.groups)

    def query(self) -> str:
        """The same report's query string (the CSV link carries it whole)."""
        pairs = [("period", self.period), ("from", self.start), ("to", self.end)]
        pairs += [("group", g) for g in self.groups]
        return urlencode(pairs + ([("tenant", self.tenant)] if self.tenant else []))


def form(
    today: date, period: str | None, start: str | None, end: str | None,
    groups: list[str] | None, *, tenant: str | None,
) -> Form:  # fmt: skip
    """The form's values: a preset fixes ``from``/``to``; ``custom`` keeps what was typed."""
    period = period if period in PERIODS else ("custom" if start or end else "this-month")
    if period != "custom":
        first, after = month_of(today, 1 if period == "last-month" else 0)
        start, end = first.isoformat(), after.isoformat()
    this = month_of(today)
    chosen = tuple(g for g in CHOICES if g in (groups or ())) or DEFAULT
    return Form(period, start or this[0].isoformat(), end or this[1].isoformat(), chosen,
                tenant or "")  # fmt: skip


@dataclass
class Sums:
    """Billed cost per currency and quantity per unit, added in integers and exact decimals."""

    billed: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    used: dict[str, Decimal] = field(default_factory=lambda: defaultdict(Decimal))
    lines: int = 0

    def add(self, row: dict[str, Any]) -> None:
        """Add one report row."""
        self.billed[row["BillingCurrency"]] += row["x_BilledCostMicros"]
        if row["ConsumedUnit"]:
            self.used[row["ConsumedUnit"]] += Decimal(row["ConsumedQuantity"])
        self.lines += row["x_Lines"]

    def costs(self) -> list[tuple[str, str]]:
        """``(currency, amount)`` pairs, as the CSV prints amounts."""
        return [(c, money(m)) for c, m in sorted(self.billed.items())]

    def quantities(self) -> list[tuple[str, str]]:
        """``(unit, quantity)`` pairs."""
        return [(u, quantity(q)) for u, q in sorted(self.used.items())]


@dataclass
class Totals:
    """The report's total, and subtotals by its first subtotal dimension (if it has two)."""

    key: str | None
    total: Sums = field(default_factory=Sums)
    by: dict[str, Sums] = field(default_factory=dict)
    rows: int = 0

    def add(self, row: dict[str, Any]) -> None:
        """Add one report row to the total and to its subtotal."""
        self.rows += 1
        self.total.add(row)
        if self.key is not None:
            self.by.setdefault(str(row[self.key] or ""), Sums()).add(row)


def totals_for(groups: tuple[str, ...]) -> Totals:
    """Totals keyed by the first subtotal dimension, when the report groups by another too."""
    keys = [SUBTOTAL[g] for g in groups if g in SUBTOTAL]
    return Totals(keys[0] if keys and len(groups) > 1 else None)
