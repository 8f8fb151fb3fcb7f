"""The pricing policy: specificity, rounding, discounts, effective dates."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from decimal import Decimal

from kiln_platform.billing.pricing import PriceList, Quantities, book_at, charges, cost, micros

T0 = datetime(2026, 1, 1, tzinfo=UTC)
BOOK = PriceList(
    version=1,
    effective_from=T0,
    prices={
        ("*", "*", "request"): Decimal(100),
        ("chat", "*", "input_token"): Decimal("0.15"),
        ("chat", "*", "output_token"): Decimal("0.6"),
        ("chat", "2", "output_token"): Decimal("0.5"),
        ("cnn", "*", "compute_second"): Decimal(2000),
    },
    discounts_bps={"enterprise": 2_000},
)


def test_most_specific_price_wins() -> None:
    assert BOOK.unit_price("chat", "2", "output_token") == Decimal("0.5")
    assert BOOK.unit_price("chat", "1", "output_token") == Decimal("0.6")
    assert BOOK.unit_price("other", "1", "request") == Decimal(100)
    assert BOOK.unit_price("other", "1", "input_token") is None


def test_lines_round_half_even_and_sum_to_the_request_cost() -> None:
    lines = charges(BOOK, "chat", "1", "standard", Quantities(input_tokens=10, output_tokens=5))
    by_unit = {c.unit: c for c in lines}
    assert by_unit["input_token"].list_cost_micros == 2  # 1.5 -> 2
    assert by_unit["output_token"].list_cost_micros == 3
    assert by_unit["request"].list_cost_micros == 100
    assert cost(lines) == (105, 105)


def test_plan_discount_applies_per_line() -> None:
    lines = charges(BOOK, "chat", "1", "enterprise", Quantities(input_tokens=1000))
    assert cost(lines) == (150 + 100, 120 + 80)


def test_unpriced_units_are_zero_priced_lines_and_zero_units_no_lines() -> None:
    lines = charges(BOOK, "emb", "1", "standard", Quantities(input_tokens=7, items=2))
    assert [(c.unit, int(c.quantity), c.cost_micros) for c in lines] == [
        ("input_token", 7, 0),
        ("request", 1, lines[1].cost_micros),
        ("item", 2, 0),
    ]
    assert lines[1].cost_micros > 0
    bare = charges(None, "chat", "1", "standard", Quantities(output_tokens=3))
    assert [(c.unit, int(c.quantity), int(c.unit_price_micros), c.cost_micros) for c in bare] == [
        ("output_token", 3, 0, 0),
        ("request", 1, 0, 0),
    ]


def test_compute_seconds_are_exact_to_the_microsecond() -> None:
    lines = charges(BOOK, "cnn", "1", "standard", Quantities(compute_ms=1.2506))
    line = next(c for c in lines if c.unit == "compute_second")
    assert line.quantity == Decimal("0.001251")
    assert line.list_cost_micros == micros(Decimal("2.502")) == 3


def test_book_in_effect() -> None:
    later = PriceList(version=2, effective_from=datetime(2026, 6, 1, tzinfo=UTC))
    books = [BOOK, later]
    assert book_at(books, datetime(2025, 12, 31, tzinfo=UTC)) is None
    assert book_at(books, T0) is BOOK
    assert book_at(books, datetime(2026, 6, 1, tzinfo=UTC)) is later


def test_a_batch_line_keeps_the_batch_discount_after_the_plans() -> None:
    book = replace(BOOK, batch_discount_bps=5_000)
    used = Quantities(input_tokens=1001)  # 150.15 + a request at 100
    online = charges(book, "chat", "1", "enterprise", used)
    batch = charges(book, "chat", "1", "enterprise", used, batch=True)
    assert [c.list_cost_micros for c in batch] == [c.list_cost_micros for c in online] == [150, 100]
    assert [c.cost_micros for c in online] == [120, 80]  # 20% off
    assert [c.cost_micros for c in batch] == [60, 40]  # then 50% off that: 60.06, rounded once
    assert cost(charges(BOOK, "chat", "1", "standard", used, batch=True)) == (250, 250)
    assert cost(charges(None, "chat", "1", "standard", used, batch=True)) == (0, 0)
