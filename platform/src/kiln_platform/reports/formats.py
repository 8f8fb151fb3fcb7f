"""A report row in its wire form: FOCUS-style columns, money as exact decimals of micro-units."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from functools import lru_cache
from typing import Any

CATEGORY = {"usage": "Usage", "adjustment": "Adjustment"}


def money(micros: int) -> str:
    """Integer micro-units as an exact decimal string: 105 -> ``0.000105``."""
    sign = "-" if micros < 0 else ""
    whole, frac = divmod(abs(micros), 1_000_000)
    return f"{sign}{whole}.{frac:06d}"


def quantity(value: Decimal) -> str:
    """A quantity without trailing zeros: ``12``, ``0.25``."""
    text = f"{value:f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


@lru_cache(maxsize=4096)
def instant(value: datetime) -> str:
    """ISO 8601 in UTC with a ``Z`` (cached: a report's rows share a few periods and days, and
    four of these were a fifth of a row's conversion)."""
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def sku(row: Any) -> str:
    """``model:version:unit`` with ``*`` for what the report does not group by, and
    ``:adapter`` when grouped by adapter (a LoRA adapter's requests)."""
    if row.kind == "adjustment":
        return "adjustment"
    base = f"{row.model or '*'}:{row.version or '*'}:{row.unit}"
    return f"{base}:{row.adapter}" if row.adapter else base


def columns(row: Any) -> dict[str, Any]:
    """The report columns of one result row (``None`` for a dimension not grouped by).

    Without day grouping, the charge period is the report's range clipped to the billing period
    (``charge_start``/``charge_end``, computed with the row's time zone).
    """
    list_cost, cost = int(row.list_cost_micros), int(row.cost_micros)
    billed = money(cost)
    usage = row.kind == "usage"
    charge_start = row.day_start or row.charge_start
    charge_end = row.day_end or row.charge_end
    ids = (row.tenant_id, row.api_key_id, row.oauth_client_id)
    tenant, key, client = (None if v is None else str(v) for v in ids)
    return {
        "BillingPeriodStart": instant(row.period_start),
        "BillingPeriodEnd": instant(row.period_end),
        "ChargePeriodStart": instant(charge_start),
        "ChargePeriodEnd": instant(charge_end),
        "BillingAccountId": tenant,
        "BillingAccountName": row.tenant_name,
        "ChargeCategory": CATEGORY[row.kind],
        "SkuId": sku(row),
        "ConsumedQuantity": quantity(row.quantity) if usage else None,
        "ConsumedUnit": row.unit if usage else None,
        "ListCost": money(list_cost),
        "EffectiveCost": billed,
        "BilledCost": billed,
        "BillingCurrency": row.currency,
        "x_Model": row.model if usage else None,
        "x_ModelVersion": row.version if usage else None,
        "x_Adapter": row.adapter if usage else None,
        "x_ApiKeyId": key,
        "x_OAuthClientId": client,
        "x_RequestId": row.request_id,
        "x_Lines": int(row.lines),
        "x_ListCostMicros": list_cost,
        "x_EffectiveCostMicros": cost,
        "x_BilledCostMicros": cost,
    }
