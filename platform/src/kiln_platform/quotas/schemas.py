"""Quota wire types. Money is integer micro-units (1 unit = 1,000,000 micro-units)."""

from __future__ import annotations

import uuid
from datetime import date, datetime
from typing import Annotated

import msgspec

Limit = Annotated[int, msgspec.Meta(ge=1, le=1_000_000_000)]
Budget = Annotated[int, msgspec.Meta(ge=0, le=10**15)]
Percent = Annotated[int, msgspec.Meta(ge=1, le=1000)]
Tokens = Annotated[int, msgspec.Meta(ge=1, le=10**15)]
DEFAULT_ALERTS = (50, 80, 100)


class Limits(msgspec.Struct, forbid_unknown_fields=True):
    """Limits; a null field means no limit (for a key: the tenant's applies)."""

    rpm: Limit | None = None
    tpm: Limit | None = None
    concurrency: Limit | None = None
    monthly_budget_micros: Budget | None = None
    batch_tokens_per_day: Tokens | None = None
    """Tokens (input + output) batch lines may use per tenant-local day: a batch that needs
    more than is left today is refused (429), a running batch's lines wait for the next day."""
    batch_enqueued_tokens: Tokens | None = None
    """Estimated tokens of open batches (OpenAI's enqueued token limit): a batch that does
    not fit beside them is refused (429)."""
    budget_alert_percents: Annotated[list[Percent], msgspec.Meta(max_length=10)] | None = None
    """Soft thresholds (percent of the monthly budget) recorded as budget events once per
    month; null: 50, 80 and 100. Only a tenant's own limits have them, not a key's."""


class KeyLimits(msgspec.Struct):
    """A per-key override."""

    api_key_id: uuid.UUID
    limits: Limits


class BudgetEventView(msgspec.Struct):
    """A soft threshold a month's spend reached."""

    period: date
    threshold_percent: int
    spent_micros: int
    limit_micros: int
    created_at: datetime


class BudgetView(msgspec.Struct):
    """This month (in the tenant's time zone): settled spend, holds in flight, the limit."""

    period: date
    timezone: str
    spent_micros: int
    reserved_micros: int
    limit_micros: int | None
    events: list[BudgetEventView]


class QuotaView(msgspec.Struct):
    """A tenant's limits, per-key overrides, and this month's spend."""

    tenant_id: uuid.UUID
    limits: Limits
    keys: list[KeyLimits]
    spent_this_month_micros: int
    budget: BudgetView
