"""The SQL of a cost report: charge lines in a range, grouped by the dimensions asked for.

Billing periods and days are calendar months and days in each tenant's time zone, computed by
PostgreSQL (``timezone(zone, ts)``), so a report's month equals the tenant's statement month.
Grouped reports read the daily rollup (``usage_charge_daily``: per tenant, local day and the
lines' dimensions) for every local day the range covers whole, and charge lines only for the
days it cuts (an API range in instants; a console range of local dates cuts none).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    Date,
    DateTime,
    Select,
    and_,
    cast,
    func,
    literal,
    literal_column,
    not_,
    null,
    or_,
    select,
    union_all,
)

from kiln_platform.billing.tables import UsageCharge as C
from kiln_platform.billing.tables import UsageChargeDaily as R
from kiln_platform.db.tables import Tenant


@dataclass(frozen=True, slots=True)
class CostQuery:
    """A validated report request: ``[start, end)``, grouping, an optional tenant.

    ``local``: ``start`` and ``end`` are dates (at midnight UTC) that mean each tenant's local
    midnight of that date (the console's days and months); otherwise they are instants."""

    start: datetime
    end: datetime
    groups: frozenset[str]
    tenant_id: uuid.UUID | None = None
    local: bool = False


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


def _bounds(q: CostQuery, zone: Any) -> tuple[Any, Any]:
    """The range's instants for a tenant in ``zone``: its local midnights if ``q.local``."""
    if not q.local:
        return literal(q.start, DateTime(timezone=True)), literal(q.end, DateTime(timezone=True))
    return tuple(  # type: ignore[return-value]
        func.timezone(zone, literal(at.replace(tzinfo=None), DateTime()),
                      type_=DateTime(timezone=True))
        for at in (q.start, q.end)
    )  # fmt: skip


ORDER = ("period_start", "day_start", "tenant_name", "tenant_id", "model", "version", "adapter",
         "api_key_id", "oauth_client_id", "kind", "unit", "currency")  # fmt: skip
MEASURES = ("quantity", "list_cost_micros", "cost_micros", "lines")
EDGE = timedelta(hours=26)
"""Longer than any local day (25 h at most): a day a range cuts lies this close to an end."""


def _charge_dims(g: frozenset[str], t: Any = C) -> dict[str, Any]:
    """The charge line's own dimensions (of ``t``, the lines or the rollup): column ->
    expression, None where not grouped."""
    credential = bool(g & {"key", "request"})
    return {
        "kind": t.kind,
        "model": t.model if g & {"model", "version"} else None,
        "version": t.version if "version" in g else None,
        "adapter": t.adapter if g & {"adapter", "request"} else None,
        "unit": t.unit,
        "currency": t.currency,
        "api_key_id": t.api_key_id if credential else None,
        "oauth_client_id": t.oauth_client_id if credential else None,
        "request_id": t.request_id if "request" in g else None,
    }


def _labelled(dims: dict[str, Any]) -> list[Any]:
    return [(null() if e is None else e).label(n) for n, e in dims.items()]


def cost_select(q: CostQuery) -> Select[Any]:
    """One row per group (or per charge line when grouping by request), in a stable order."""
    if "request" in q.groups:
        return _per_line(q)
    return _grouped(q)


def _per_line(q: CostQuery) -> Select[Any]:
    zone, at, day = Tenant.timezone, C.charged_at, "day" in q.groups
    lo, hi = _bounds(q, zone)
    period_start, period_end = _local(zone, at, "month"), _local(zone, at, "month", "1 month")
    dims = {
        "period_start": period_start,
        "period_end": period_end,
        "day_start": _local(zone, at, "day") if day else None,
        "day_end": _local(zone, at, "day", "1 day") if day else None,
        "tenant_id": C.tenant_id if "tenant" in q.groups else None,
        "tenant_name": Tenant.name if "tenant" in q.groups else None,
        **_charge_dims(q.groups),
        "charge_start": func.greatest(period_start, lo),
        "charge_end": func.least(period_end, hi),
        "day": cast(func.timezone(zone, at), Date) if day else None,
    }
    measures = [C.quantity, C.list_cost_micros, C.cost_micros, literal_column("1")]
    columns = _labelled(dims) + [m.label(n) for m, n in zip(measures, MEASURES, strict=True)]
    query = select(*columns).select_from(C).join(Tenant, Tenant.id == C.tenant_id)
    query = query.where(at >= lo, at < hi)
    if q.local:  # an index range for the tenants' local bounds (offsets within a day of UTC)
        query = query.where(at >= q.start - EDGE, at < q.end + EDGE)
    query = query if q.tenant_id is None else query.where(C.tenant_id == q.tenant_id)
    return query.order_by(at, C.id)


def _whole(q: CostQuery, zone: Any, local_day: Any) -> Any:
    """Whether the range covers a tenant's local day whole (always, for a local range)."""
    return and_(_local(zone, local_day, None) >= q.start,
                _local(zone, local_day, None, "1 day") <= q.end)  # fmt: skip


def _part(q: CostQuery, t: Any, local_day: Any, measures: list[Any]) -> Select[Any]:
    """Sums per tenant, local day and the grouped charge dimensions, of the lines or rollup."""
    charge = {n: e for n, e in _charge_dims(q.groups, t).items() if e is not None}
    dims = [Tenant.id.label("tenant_id"), local_day.label("local_day"),
            *(e.label(n) for n, e in charge.items())]  # fmt: skip
    query = select(*dims, Tenant.timezone.label("zone"), Tenant.name.label("tenant_name"),
                   *(m.label(n) for m, n in zip(measures, MEASURES, strict=True)))  # fmt: skip
    query = query.select_from(t).join(Tenant, Tenant.id == t.tenant_id).group_by(*dims)
    return query if q.tenant_id is None else query.where(t.tenant_id == q.tenant_id)


def _rollup(q: CostQuery) -> Select[Any]:
    """The rollup's days the range covers whole."""
    local_day = cast(R.day, DateTime())
    sums = [func.sum(R.quantity), func.sum(R.list_cost_micros), func.sum(R.cost_micros),
            func.sum(R.lines)]  # fmt: skip
    query = _part(q, R, local_day, sums)
    if q.local:
        return query.where(R.day >= q.start.date(), R.day < q.end.date())
    query = query.where(R.day >= (q.start - EDGE).date(), R.day <= (q.end + EDGE).date())
    return query.where(_whole(q, Tenant.timezone, local_day))


def _edges(q: CostQuery) -> Select[Any]:
    """The charge lines of the local days the range cuts (within ``EDGE`` of its ends)."""
    local_day = func.date_trunc(
        literal_column("'day'"), func.timezone(Tenant.timezone, C.charged_at)
    )
    sums = [func.sum(C.quantity), func.sum(C.list_cost_micros), func.sum(C.cost_micros),
            func.count()]  # fmt: skip
    query = _part(q, C, local_day, sums).where(C.charged_at >= q.start, C.charged_at < q.end)
    query = query.where(or_(C.charged_at < q.start + EDGE, C.charged_at >= q.end - EDGE))
    return query.where(not_(_whole(q, Tenant.timezone, local_day)))


def _grouped(q: CostQuery) -> Select[Any]:
    """Two steps: per tenant and local day (the rollup's rows, and the cut days' lines), then
    the periods of those few groups, re-grouped as asked."""
    inner = (_rollup(q) if q.local else union_all(_rollup(q), _edges(q))).subquery()
    s, day, tenant = inner.c, "day" in q.groups, "tenant" in q.groups
    month = func.date_trunc(literal_column("'month'"), s.local_day)
    period_start, period_end = _local(s.zone, month, None), _local(s.zone, month, None, "1 month")
    dims = {
        "period_start": period_start,
        "period_end": period_end,
        "day_start": _local(s.zone, s.local_day, None) if day else None,
        "day_end": _local(s.zone, s.local_day, None, "1 day") if day else None,
        "tenant_id": s.tenant_id if tenant else None,
        "tenant_name": s.tenant_name if tenant else None,
        **{n: s.get(n) for n in _charge_dims(q.groups)},
    }
    lo, hi = _bounds(q, s.zone)
    derived = [func.min(func.greatest(period_start, lo)).label("charge_start"),
               func.max(func.least(period_end, hi)).label("charge_end"),
               (func.min(cast(s.local_day, Date)) if day else null()).label("day")]  # fmt: skip
    totals = [func.sum(s[n]).label(n) for n in MEASURES]
    query = select(*_labelled(dims), *derived, *totals)
    query = query.group_by(*(e for e in dims.values() if e is not None))
    return query.order_by(*(literal_column(name) for name in ORDER))
