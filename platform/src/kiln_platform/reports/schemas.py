"""Wire forms of the reports context, and the report's column dictionary (docs/billing.md)."""

from __future__ import annotations

import uuid
from datetime import date, datetime
from typing import Annotated

import msgspec

COLUMNS = (
    "BillingPeriodStart",
    "BillingPeriodEnd",
    "ChargePeriodStart",
    "ChargePeriodEnd",
    "BillingAccountId",
    "BillingAccountName",
    "ChargeCategory",
    "SkuId",
    "ConsumedQuantity",
    "ConsumedUnit",
    "ListCost",
    "EffectiveCost",
    "BilledCost",
    "BillingCurrency",
    "x_Model",
    "x_ModelVersion",
    "x_Adapter",
    "x_ApiKeyId",
    "x_OAuthClientId",
    "x_RequestId",
    "x_Lines",
    "x_ListCostMicros",
    "x_EffectiveCostMicros",
    "x_BilledCostMicros",
)
"""The report's columns, in order; FOCUS 1.x names, Kiln's own ones prefixed ``x_``."""

GROUPS = ("tenant", "model", "version", "adapter", "key", "day", "request")
"""What ``group_by`` may name; billing period, charge category, unit and currency always are."""
DEFAULT_GROUPS = "tenant,model,version"


class AdjustmentCreate(msgspec.Struct, forbid_unknown_fields=True):
    """A correction, charged now (in the open period): negative amounts are credits."""

    amount_micros: Annotated[int, msgspec.Meta(ge=-(10**15), le=10**15)]
    reason: Annotated[str, msgspec.Meta(min_length=1, max_length=1000)]
    corrects_period: Annotated[str, msgspec.Meta(pattern=r"^\d{4}-(0[1-9]|1[0-2])$")]
    """The month it corrects, ``YYYY-MM``."""


class AdjustmentView(msgspec.Struct):
    """An adjustment line as stored."""

    id: int
    request_id: str
    tenant_id: uuid.UUID
    amount_micros: int
    amount: str
    currency: str
    reason: str
    corrects_period: str
    charged_at: datetime


class StatementView(msgspec.Struct):
    """A closed (immutable) monthly statement."""

    id: uuid.UUID
    tenant_id: uuid.UUID
    period: str
    """``YYYY-MM``: the calendar month in the tenant's time zone."""
    currency: str
    list_cost_micros: int
    cost_micros: int
    list_cost: str
    cost: str
    lines: int
    closed_at: datetime
    closed_by: str


def month(period: date) -> str:
    """``YYYY-MM`` of the first day of a month."""
    return f"{period.year:04d}-{period.month:02d}"
