"""The SQL of a cost report: charge lines in a range, grouped by the dimensions asked for.

Billing periods and days are calendar months and days in each tenant's time zone, computed by
PostgreSQL (``timezone(zone, ts)``), so a report's month equals the tenant's statement month.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import DateTime, Select, func, literal_column, null, select

from kiln_platform.billing.tables import UsageCharge as C
from kiln_platform.db.tables import Tenant


@dataclass(frozen=True, slots=True)
class CostQuery:
    """A validated report request: ``[start, end)``, grouping, an optional tenant."""

    start: datetime
    end: datetime
    groups: frozenset[str]
    tenant_id: uuid.UUID | None = None


def _local(unit: str, step: str | None = None) -> Any:
    """The start (or, with ``step``, the end) of the tenant-local month/day of a charge."""
    truncated: Any = func.date_trunc(
        literal_column(f"'{unit}'"), func.timezone(Tenant.timezone, C.charged_at)
    )
    if step is not None:
        truncated = truncated + literal_column(f"interval '{step}'")
    return func.timezone(Tenant.timezone, truncated, type_=DateTime(timezone=True))


ORDER = ("period_start", "day_start", "tenant_name", "tenant_id", "model", "version",
         "api_key_id", "oauth_client_id", "kind", "unit", "currency")  # fmt: skip
MEASURES = ("quantity", "list_cost_micros", "cost_micros", "lines")


def _dimensions(g: frozenset[str]) -> dict[str, Any]:
    """Output column -> expression, or None where the dimension is not grouped by."""
    credential = bool(g & {"key", "request"})
    return {
        "period_start": _local("month"),
        "period_end": _local("month", "1 month"),
        "day_start": _local("day") if "day" in g else None,
        "day_end": _local("day", "1 day") if "day" in g else None,
        "tenant_id": C.tenant_id if "tenant" in g else None,
        "tenant_name": Tenant.name if "tenant" in g else None,
        "kind": C.kind,
        "model": C.model if g & {"model", "version"} else None,
        "version": C.version if "version" in g else None,
        "unit": C.unit,
        "currency": C.currency,
        "api_key_id": C.api_key_id if credential else None,
        "oauth_client_id": C.oauth_client_id if credential else None,
        "request_id": C.request_id if "request" in g else None,
    }


def cost_select(q: CostQuery) -> Select[Any]:
    """One row per group (or per charge line when grouping by request), in a stable order."""
    per_line = "request" in q.groups
    dims = _dimensions(q.groups)
    if per_line:
        measures = [C.quantity, C.list_cost_micros, C.cost_micros, literal_column("1")]
    else:
        measures = [func.sum(C.quantity), func.sum(C.list_cost_micros), func.sum(C.cost_micros),
                    func.count()]  # fmt: skip
    columns = [(null() if e is None else e).label(n) for n, e in dims.items()]
    columns += [m.label(n) for m, n in zip(measures, MEASURES, strict=True)]
    query = (
        select(*columns)
        .select_from(C)
        .join(Tenant, Tenant.id == C.tenant_id)
        .where(C.charged_at >= q.start, C.charged_at < q.end)
    )
    if q.tenant_id is not None:
        query = query.where(C.tenant_id == q.tenant_id)
    if per_line:
        return query.order_by(C.charged_at, C.id)
    query = query.group_by(*(e for e in dims.values() if e is not None))
    return query.order_by(*(literal_column(name) for name in ORDER))
