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


def _local(zone: Any, at: Any, unit: str | None, step: str | None = None) -> Any:
    """The start (or, with ``step``, the end) of the local month or day of ``at`` in ``zone``.

    ``at`` is a timestamptz, or already a local timestamp when ``unit`` is None.
    """
    local = (
        at
        if unit is None
        else func.date_trunc(literal_column(f"'{unit}'"), func.timezone(zone, at))
    )
    if step is not None:
        local = local + literal_column(f"interval '{step}'")
    return func.timezone(zone, local, type_=DateTime(timezone=True))


ORDER = ("period_start", "day_start", "tenant_name", "tenant_id", "model", "version", "adapter",
         "api_key_id", "oauth_client_id", "kind", "unit", "currency")  # fmt: skip
MEASURES = ("quantity", "list_cost_micros", "cost_micros", "lines")


def _charge_dims(g: frozenset[str]) -> dict[str, Any]:
    """The charge line's own dimensions: column -> expression, None where not grouped."""
    credential = bool(g & {"key", "request"})
    return {
        "kind": C.kind,
        "model": C.model if g & {"model", "version"} else None,
        "version": C.version if "version" in g else None,
        "adapter": C.adapter if g & {"adapter", "request"} else None,
        "unit": C.unit,
        "currency": C.currency,
        "api_key_id": C.api_key_id if credential else None,
        "oauth_client_id": C.oauth_client_id if credential else None,
        "request_id": C.request_id if "request" in g else None,
    }


def _in_range(query: Select[Any], q: CostQuery) -> Select[Any]:
    query = query.select_from(C).join(Tenant, Tenant.id == C.tenant_id)
    query = query.where(C.charged_at >= q.start, C.charged_at < q.end)
    return query if q.tenant_id is None else query.where(C.tenant_id == q.tenant_id)


def _labelled(dims: dict[str, Any]) -> list[Any]:
    return [(null() if e is None else e).label(n) for n, e in dims.items()]


def cost_select(q: CostQuery) -> Select[Any]:
    """One row per group (or per charge line when grouping by request), in a stable order."""
    if "request" in q.groups:
        return _per_line(q)
    return _grouped(q)


def _per_line(q: CostQuery) -> Select[Any]:
    zone, at, day = Tenant.timezone, C.charged_at, "day" in q.groups
    dims = {
        "period_start": _local(zone, at, "month"),
        "period_end": _local(zone, at, "month", "1 month"),
        "day_start": _local(zone, at, "day") if day else None,
        "day_end": _local(zone, at, "day", "1 day") if day else None,
        "tenant_id": C.tenant_id if "tenant" in q.groups else None,
        "tenant_name": Tenant.name if "tenant" in q.groups else None,
        **_charge_dims(q.groups),
    }
    measures = [C.quantity, C.list_cost_micros, C.cost_micros, literal_column("1")]
    columns = _labelled(dims) + [m.label(n) for m, n in zip(measures, MEASURES, strict=True)]
    return _in_range(select(*columns), q).order_by(C.charged_at, C.id)


def _grouped(q: CostQuery) -> Select[Any]:
    """Two steps: per tenant and local day in one pass over the lines (one time-zone conversion
    each), then the periods of those few groups, re-grouped as asked."""
    charge = {n: e for n, e in _charge_dims(q.groups).items() if e is not None}
    local_day = func.date_trunc(
        literal_column("'day'"), func.timezone(Tenant.timezone, C.charged_at)
    )
    inner_dims = [Tenant.id.label("tenant_id"), local_day.label("local_day"),
                  *(e.label(n) for n, e in charge.items())]  # fmt: skip
    sums: list[Any] = [func.sum(C.quantity), func.sum(C.list_cost_micros), func.sum(C.cost_micros),
            func.count()]  # fmt: skip
    inner = _in_range(
        select(*inner_dims, Tenant.timezone.label("zone"), Tenant.name.label("tenant_name"),
               *(m.label(n) for m, n in zip(sums, MEASURES, strict=True))), q
    ).group_by(*inner_dims).subquery()  # fmt: skip
    s, day, tenant = inner.c, "day" in q.groups, "tenant" in q.groups
    month = func.date_trunc(literal_column("'month'"), s.local_day)
    dims = {
        "period_start": _local(s.zone, month, None),
        "period_end": _local(s.zone, month, None, "1 month"),
        "day_start": _local(s.zone, s.local_day, None) if day else None,
        "day_end": _local(s.zone, s.local_day, None, "1 day") if day else None,
        "tenant_id": s.tenant_id if tenant else None,
        "tenant_name": s.tenant_name if tenant else None,
        **{n: (s[n] if n in charge else None) for n in _charge_dims(q.groups)},
    }
    totals = [func.sum(s[n]).label(n) for n in MEASURES]
    query = select(*_labelled(dims), *totals).group_by(*(e for e in dims.values() if e is not None))
    return query.order_by(*(literal_column(name) for name in ORDER))
