"""Admin API wire types for price books (msgspec; constraints appear in OpenAPI).

Unit prices travel as decimal strings of micro-units (``"0.25"`` is a quarter of a micro-unit),
never as JSON numbers, so no float ever touches money.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

import msgspec

ModelName = Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
ModelVersion = Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
Plan = Annotated[str, msgspec.Meta(min_length=1, max_length=32)]
Bps = Annotated[int, msgspec.Meta(ge=0, le=10_000)]
Currency = Annotated[str, msgspec.Meta(pattern=r"^[A-Z]{3}$")]


class PriceIn(msgspec.Struct, forbid_unknown_fields=True):
    """One unit price: ``model`` / ``model_version`` may be ``*`` (any)."""

    model: ModelName
    unit: str
    unit_price_micros: str
    model_version: ModelVersion = "*"


class PriceBookCreate(msgspec.Struct, forbid_unknown_fields=True):
    """A new price-book version; it applies from ``effective_from`` until the next one."""

    prices: list[PriceIn]
    effective_from: datetime
    currency: Currency = "USD"
    discounts: dict[Plan, Bps] = msgspec.field(default_factory=dict)
    note: Annotated[str, msgspec.Meta(max_length=1000)] | None = None
    batch_discount_bps: Bps = 0
    """Off each Batches API line (after the plan's discount), in basis points."""


class PriceView(msgspec.Struct):
    """A unit price as stored (exact decimal string of micro-units)."""

    model: str
    model_version: str
    unit: str
    unit_price_micros: str


class PriceBookView(msgspec.Struct):
    """One price-book version."""

    version: int
    currency: str
    effective_from: datetime
    note: str | None
    created_at: datetime
    prices: list[PriceView]
    discounts: dict[str, int]
    batch_discount_bps: int = 0
