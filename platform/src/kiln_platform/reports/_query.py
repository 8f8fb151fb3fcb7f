"""The SQL of a cost report: charge lines in a range, grouped by the dimensions asked for.

Billing periods and days are calendar months and days in each tenant's time zone, computed by
PostgreSQL (``timezone(zone, ts)``), so a report's month equals the tenant's statement month.
Grouped reports read a daily rollup for every local day the range covers whole, and charge
lines only for the days it cuts (an API range in instants; a console range of local dates cuts
none): ``usage_charge_model_daily`` (per tenant, local day and model) when the report groups by
tenant, model and day only, else ``usage_charge_daily`` (per tenant, local day and every
dimension of the lines).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace
from datetime import date, datetime, timedelta
from typing import Any

from sqlalchemy import (
    ARRAY,
    BigInteger,
    CompoundSelect,
    Date,
    DateTime,
    Select,
    String,
    Uuid,
    and_,
    any_,
    cast,
    func,
    literal,
    literal_column,
    not_,
    null,
    or_,
    select,
    tuple_,
    union_all,
)

from kiln_platform.billing.tables import UsageCharge as C
from kiln_platform.billing.tables import UsageChargeDaily as R
from kiln_platform.billing.tables import UsageChargeModelDaily as M
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
    limit: int | None = None
    """At most this many rows, each with ``groups``: how many the whole report has."""
    also: frozenset[str] | None = None
    """With ``limit``: after those rows (``part`` 0), the same report grouped by these only
    (``part`` 1; a subset of ``groups``), from the same read."""


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
BY_MODEL = frozenset({"tenant", "model", "day"})
"""The groupings ``usage_charge_model_daily`` answers; by model and day, a row of it is a group
of ``_part``'s (no aggregate over tens of thousands of groups)."""
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


_UUID = ("tenant_id", "api_key_id", "oauth_client_id")


def _labelled(dims: dict[str, Any]) -> list[Any]:
    """The columns, a dimension not grouped by as a NULL of its type (a report and its coarser
    one are one UNION)."""
    return [(_null(n) if e is None else e).label(n) for n, e in dims.items()]


def _null(name: str) -> Any:
    kind = DateTime(timezone=True) if "start" in name or "end" in name else String()
    return cast(null(), Uuid() if name in _UUID else Date() if name == "day" else kind)


def cost_select(q: CostQuery) -> Select[Any] | CompoundSelect[Any]:
    """One row per group (or per charge line when grouping by request), in a stable order."""
    if "request" in q.groups:
        query = _per_line(q)
        return query if q.limit is None else _counted(query).limit(q.limit)
    inner = (_rollup(q) if q.local else union_all(_rollup(q), _edges(q))).cte("by_day")
    query = _grouped(q, inner)
    if q.limit is None:
        return query
    if "groups" not in query.selected_columns:
        query = _counted(query)
    query = query.limit(q.limit)
    if q.also is None:
        return query
    first = query.add_columns(literal(0).label("part")).subquery()
    rest = _grouped(replace(q, groups=q.also, limit=None), inner, coarser=True)
    rest = rest.add_columns(
        cast(null(), BigInteger).label("groups"), literal(1).label("part")
    ).order_by(None)
    both = union_all(select(first), rest)
    return both.order_by(literal_column("part"), *(literal_column(name) for name in ORDER))


def _counted(query: Select[Any]) -> Select[Any]:
    return query.add_columns(func.count().over().label("groups"))


def spend_select(
    first: date, after: date, period: tuple[date, date], tenant_id: uuid.UUID | None
) -> Select[Any]:
    """Billed cost from the per-model daily rollup in the local days ``[first, after)``, in one
    pass: per currency and day (``tenant_name`` None), and per currency and tenant over
    ``period``'s days (``day`` None; ``period_micros`` None for a tenant without lines in it)."""
    in_period = and_(M.day >= period[0], M.day < period[1])
    columns: list[Any] = [
        M.currency,
        Tenant.name.label("tenant_name"),
        M.day,
        func.sum(M.cost_micros).label("micros"),
        func.sum(M.cost_micros).filter(in_period).label("period_micros"),
    ]
    query = select(*columns)
    query = query.select_from(M).join(Tenant, Tenant.id == M.tenant_id)
    query = query.where(M.day >= first, M.day < after)
    query = query if tenant_id is None else query.where(M.tenant_id == tenant_id)
    by_day, by_tenant = tuple_(M.currency, M.day), tuple_(M.currency, Tenant.name)
    return query.group_by(func.grouping_sets(by_day, by_tenant))


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


def _part(
    q: CostQuery, t: Any, local_day: Any, measures: list[Any], *, grouped: bool = True
) -> Select[Any]:
    """Sums per tenant, local day (or month, when the report is not by day) and the grouped
    charge dimensions, of the lines or a rollup (``grouped`` False: its rows are those)."""
    charge = {n: e for n, e in _charge_dims(q.groups, t).items() if e is not None}
    if "day" not in q.groups:  # fewer rows: the outer query needs only the month
        local_day = func.date_trunc(literal_column("'month'"), local_day)
    dims = [Tenant.id.label("tenant_id"), local_day.label("local_day"),
            *(e.label(n) for n, e in charge.items())]  # fmt: skip
    query = select(*dims, Tenant.timezone.label("zone"), Tenant.name.label("tenant_name"),
                   *(m.label(n) for m, n in zip(measures, MEASURES, strict=True)))  # fmt: skip
    query = query.select_from(t).join(Tenant, Tenant.id == t.tenant_id)
    query = query.group_by(*dims) if grouped else query
    return query if q.tenant_id is None else query.where(t.tenant_id == q.tenant_id)


def _rollup(q: CostQuery) -> Select[Any]:
    """The rollup's days the range covers whole."""
    t = M if q.groups <= BY_MODEL else R
    local_day = cast(t.day, DateTime())
    grouped = t is R or not {"model", "day"} <= q.groups
    columns = [t.quantity, t.list_cost_micros, t.cost_micros, t.lines]
    sums = [func.sum(c) for c in columns] if grouped else columns
    query = _part(q, t, local_day, sums, grouped=grouped)
    if q.local:
        return query.where(t.day >= q.start.date(), t.day < q.end.date())
    query = query.where(t.day >= (q.start - EDGE).date(), t.day <= (q.end + EDGE).date())
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


def _grouped(
    q: CostQuery, inner: Any, *, coarser: bool = False, exact: bool = False
) -> Select[Any]:
    """Two steps: ``inner``, per tenant and local day or month (the rollup's rows, and the cut
    days' lines), then the periods of those groups, re-grouped as asked (unless they already
    are: not when ``inner`` was grouped for a report by more, or may hold a tenant's month
    twice, as lines and as rollup; ``exact``: it is the report's groups)."""
    s, day, tenant = inner.c, "day" in q.groups, "tenant" in q.groups
    if tenant and not exact and (coarser or not (q.local or day)):
        return _grouped(q, _per_tenant(q, inner), exact=True)
    instants = _instants(q, inner, f"{inner.name}_{'rest' if coarser else 'first'}_instants")
    z = instants.c
    dims = {
        "period_start": z.period_start,
        "period_end": z.period_end,
        "day_start": z.day_start if day else None,
        "day_end": z.day_end if day else None,
        "tenant_id": s.tenant_id if tenant else None,
        "tenant_name": s.tenant_name if tenant else None,
        **{n: None if e is None else s.get(n) for n, e in _charge_dims(q.groups).items()},
    }
    derived = [z.charge_start, z.charge_end, cast(s.local_day, Date) if day else _null("day")]
    names = ("charge_start", "charge_end", "day")
    joined = inner.join(instants, and_(z.zone == s.zone, z.local_day == s.local_day))
    if tenant:  # the first step's groups are the report's
        columns = [*(e.label(n) for e, n in zip(derived, names, strict=True)),
                   *(s[n].label(n) for n in MEASURES)]  # fmt: skip
        query = select(*_labelled(dims), *columns).select_from(joined)
        if q.limit is not None:
            query = _first(query, q.limit, s, z)
        return _ordered(query)
    named = [func.min(derived[0]).label(names[0]), func.max(derived[1]).label(names[1]),
             func.min(derived[2]).label(names[2])]  # fmt: skip
    totals = [func.sum(s[n]).label(n) for n in MEASURES]
    query = select(*_labelled(dims), *named, *totals).select_from(joined)
    return _ordered(query.group_by(*(e for e in dims.values() if e is not None)))


def _first(query: Select[Any], limit: int, s: Any, z: Any) -> Select[Any]:
    """Only the groups of the pairs (zone, local day) that hold a report's first ``limit`` rows
    (``s``, the groups; ``z``, the pairs: ``_instants``), with how many groups it has in all.

    Their local days are picked first, a test on each group's own column: the row estimates
    (one, whatever the rollup holds: row-level security) may otherwise make PostgreSQL hash
    every group to join them to the few pairs it keeps."""
    first = z.before < limit
    days = cast(select(func.array_agg(z.local_day)).where(first).scalar_subquery(),
                ARRAY(DateTime()))  # an array (a cast is no subquery to ANY)  # fmt: skip
    total = cast(select(func.sum(z.rows)).scalar_subquery(), BigInteger)
    return query.add_columns(total.label("groups")).where(first, s.local_day == any_(days))


def _per_tenant(q: CostQuery, inner: Any) -> Any:
    """``inner`` summed per tenant, local day (or month) and the grouped charge dimensions: the
    groups of a report by tenant, on plain columns (the instants follow, per group)."""
    s = inner.c
    local = (
        s.local_day
        if "day" in q.groups
        else func.date_trunc(literal_column("'month'"), s.local_day)
    )
    charge = [s[n] for n, e in _charge_dims(q.groups).items() if e is not None]
    keys = [s.tenant_id, s.tenant_name, s.zone, local.label("local_day"), *charge]
    sums = [func.sum(s[n]).label(n) for n in MEASURES]
    return select(*keys, *sums).group_by(*keys).cte("per_tenant")


def _instants(q: CostQuery, inner: Any, name: str) -> Any:
    """The instants of each time zone and local day (or month) among the groups: computed once
    a pair, not once a group (thousands of tenants share a few zones; materialized, or
    PostgreSQL computes them after the join, once a group). With each pair, its groups
    (``rows``) and those of the pairs before it in the report's order (``before``): a report's
    first rows are in the pairs with fewer than that many before them."""
    keys = inner.c.zone, inner.c.local_day
    pairs = select(*keys, func.count().label("rows")).group_by(*keys).subquery()
    zone, local_day = pairs.c.zone, pairs.c.local_day
    month = func.date_trunc(literal_column("'month'"), local_day)
    period = _local(zone, month, None), _local(zone, month, None, "1 month")
    day = _local(zone, local_day, None)
    lo, hi = _bounds(q, zone)
    upto = func.sum(pairs.c.rows).over(order_by=[period[0], day])  # with the pair's peers
    peers = func.sum(pairs.c.rows).over(partition_by=[period[0], day])
    query = select(zone, local_day, period[0].label("period_start"),
                  period[1].label("period_end"), day.label("day_start"),
                  _local(zone, local_day, None, "1 day").label("day_end"),
                  func.greatest(period[0], lo).label("charge_start"),
                  func.least(period[1], hi).label("charge_end"), pairs.c.rows,
                  (upto - peers).label("before"))  # fmt: skip
    return query.cte(name).prefix_with("MATERIALIZED")


def _ordered(query: Select[Any]) -> Select[Any]:
    return query.order_by(*(literal_column(name) for name in ORDER))
