"""Quota wire types. Money is integer micro-units (1 unit = 1,000,000 micro-units)."""

from __future__ import annotations

import uuid
from typing import Annotated

import msgspec

Limit = Annotated[int, msgspec.Meta(ge=1, le=1_000_000_000)]
Budget = Annotated[int, msgspec.Meta(ge=0, le=10**15)]


class Limits(msgspec.Struct, forbid_unknown_fields=True):
    """Limits; a null field means no limit (for a key: the tenant's applies)."""

    rpm: Limit | None = None
    tpm: Limit | None = None
    concurrency: Limit | None = None
    monthly_budget_micros: Budget | None = None


class KeyLimits(msgspec.Struct):
    """A per-key override."""

    api_key_id: uuid.UUID
    limits: Limits


class QuotaView(msgspec.Struct):
    """A tenant's limits, per-key overrides, and this month's spend."""

    tenant_id: uuid.UUID
    limits: Limits
    keys: list[KeyLimits]
    spent_this_month_micros: int
