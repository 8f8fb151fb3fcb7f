"""Pricing policy (pure): which price applies, and what a request costs, in micro-units.

A request's usage becomes one charge line per unit it consumed. Each line's list cost is
``quantity * unit price`` and its effective cost that less the plan's discount, each rounded
half-to-even to a whole micro-unit once; a request's cost is the sum of its lines, so reports
that add lines and a ledger that adds requests agree exactly.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from datetime import datetime
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Literal

Unit = Literal["input_token", "output_token", "request", "item", "compute_second"]
UNITS: tuple[Unit, ...] = ("input_token", "output_token", "request", "item", "compute_second")
ANY = "*"
_ONE = Decimal(1)
_ZERO = Decimal(0)
_BPS = Decimal(10_000)


@dataclass(frozen=True, slots=True)
class PriceList:
    """One price-book version: unit prices by (model, model version, unit), plan discounts."""

    version: int
    effective_from: datetime
    currency: str = "USD"
    prices: dict[tuple[str, str, str], Decimal] = field(default_factory=dict)
    discounts_bps: dict[str, int] = field(default_factory=dict)
    batch_discount_bps: int = 0
    """Off a Batches API line, after the plan's discount."""

    def unit_price(self, model: str, version: str, unit: str) -> Decimal | None:
        """The most specific price: this version, then any version, then any model."""
        for key in ((model, version, unit), (model, ANY, unit), (ANY, ANY, unit)):
            if key in self.prices:
                return self.prices[key]
        return None


@dataclass(frozen=True, slots=True)
class Quantities:
    """What one request consumed, per billable unit."""

    input_tokens: int = 0
    output_tokens: int = 0
    requests: int = 1
    items: int = 0
    compute_ms: float = 0.0

    def by_unit(self) -> dict[Unit, Decimal]:
        """Quantities keyed by unit (compute in seconds, to the microsecond)."""
        return {
            "input_token": Decimal(self.input_tokens),
            "output_token": Decimal(self.output_tokens),
            "request": Decimal(self.requests),
            "item": Decimal(self.items),
            "compute_second": Decimal(round(self.compute_ms * 1000)) / 1_000_000,
        }


@dataclass(frozen=True, slots=True)
class Charge:
    """One priced line."""

    unit: Unit
    quantity: Decimal
    unit_price_micros: Decimal
    list_cost_micros: int
    cost_micros: int


def micros(amount: Decimal) -> int:
    """Round an exact amount to whole micro-units, half to even."""
    return int(amount.quantize(_ONE, rounding=ROUND_HALF_EVEN))


def charges(
    book: PriceList | None, model: str, version: str, plan: str, used: Quantities,
    *, batch: bool = False,
) -> list[Charge]:  # fmt: skip
    """The charge lines of a request: one per unit it consumed. A unit without a price (or
    without any price book) is a line at price zero, so usage is reported before it is priced.
    A Batches API line (``batch``) keeps the book's batch discount off too: the two discounts
    compose (20% and 50% leave 40%), rounded once per line."""
    keep = _ONE if book is None else (_BPS - book.discounts_bps.get(plan, 0)) / _BPS
    if batch and book is not None:
        keep *= (_BPS - book.batch_discount_bps) / _BPS
    lines = []
    for unit, quantity in used.by_unit().items():
        if quantity == 0:
            continue
        price = None if book is None else book.unit_price(model, version, unit)
        price = _ZERO if price is None else price
        amount = quantity * price
        lines.append(Charge(unit, quantity, price, micros(amount), micros(amount * keep)))
    return lines


def cost(lines: list[Charge]) -> tuple[int, int]:
    """(list cost, effective cost) of a request's lines."""
    return sum(c.list_cost_micros for c in lines), sum(c.cost_micros for c in lines)


def book_at(books: list[PriceList], when: datetime) -> PriceList | None:
    """The price-book version in effect at ``when`` (``books`` sorted by effective date)."""
    i = bisect.bisect_right([b.effective_from for b in books], when)
    return books[i - 1] if i else None
