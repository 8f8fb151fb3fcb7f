"""Cost reports: validate the request, then stream rows straight from a server-side cursor.

Nothing is loaded whole: PostgreSQL groups (or, by request, just orders) the charge lines and
the rows are encoded as they arrive, ``CHUNK`` bytes at a time, as CSV or JSON.
"""

from __future__ import annotations

import csv
import io
import re
import uuid
from contextlib import aclosing
from datetime import UTC, date, datetime, time
from typing import TYPE_CHECKING, Any, Literal

import msgspec
from sqlalchemy import text

from kiln_platform.admin.authz import Actor, check_tenant, require
from kiln_platform.errors import BadRequest
from kiln_platform.reports._query import CostQuery, cost_select, spend_select
from kiln_platform.reports.formats import columns, money
from kiln_platform.reports.schemas import COLUMNS, DEFAULT_GROUPS, GROUPS

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, AsyncIterator, Callable
    from contextlib import AbstractAsyncContextManager

    from sqlalchemy import Row
    from sqlalchemy.ext.asyncio import AsyncSession

    Scope = Callable[[], AbstractAsyncContextManager[AsyncSession]]

Format = Literal["csv", "json"]
CHUNK = 64 * 1024
YIELD_PER = 2000


def instant(value: str, param: str) -> datetime:
    """An ISO 8601 date (midnight UTC) or datetime (UTC unless it has an offset)."""
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise BadRequest(f"'{param}' is not an ISO 8601 date or datetime: {value!r}.",
                         param=param) from None  # fmt: skip
    if len(value) == 10:  # a date
        parsed = datetime.combine(date.fromisoformat(value), time(), UTC)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def cost_query(
    actor: Actor, start: str, end: str, group_by: str | None, tenant_id: uuid.UUID | None,
    *, local: bool = False,
) -> CostQuery:  # fmt: skip
    """Check access and the parameters (400 naming the parameter) before any row is sent.

    ``local``: a range of two dates means each tenant's local days (the console's); otherwise,
    as the API documents, a date is midnight UTC."""
    require(actor, "reports")
    if tenant_id is not None:
        check_tenant(actor, tenant_id, "tenant")
    q_start, q_end = instant(start, "from"), instant(end, "to")
    if q_start >= q_end:
        raise BadRequest("'from' must be before 'to'.", param="to")
    names = [n.strip() for n in (group_by or DEFAULT_GROUPS).split(",") if n.strip()]
    unknown = sorted(set(names) - set(GROUPS))
    if unknown:
        raise BadRequest(f"'group_by' may name {', '.join(GROUPS)}; not {', '.join(unknown)}.",
                         param="group_by")  # fmt: skip
    dates = local and len(start) == len(end) == 10
    return CostQuery(q_start, q_end, frozenset(names), actor.tenant_id or tenant_id, dates)


def report_format(fmt: str | None, accept: str | None) -> Format:
    """``format=csv|json``, else ``Accept: text/csv`` asks for CSV; JSON by default."""
    if fmt is None:
        return "csv" if accept and "text/csv" in accept else "json"
    if fmt not in ("csv", "json"):
        raise BadRequest("'format' must be 'csv' or 'json'.", param="format")
    return fmt  # type: ignore[return-value]


CUSTOM_PLANS = text("SET LOCAL plan_cache_mode = force_custom_plan")
"""asyncpg prepares each statement once per connection; from its sixth run PostgreSQL may plan
it for any range (a generic plan), which for a month of 1,000,000 charge lines took over 12 s
instead of 2 s (bench/console.py, docs/benchmarks.md). A report is planned for its own range."""


WORK_MEM = text("SET LOCAL work_mem = '64MB'")
"""A month of a thousand tenants' days is ~60,000 rollup rows: grouped and sorted in memory
(with the default 4 MB they spilled to disk, a third of the query's time)."""
NO_NESTED_LOOPS = text("SET LOCAL enable_nestloop = off")
"""Row-level security's policy hides the row counts from the planner (it estimates one row),
so it joined the rollup's groups to their instants in a nested loop: 600,000 comparisons
for a month by tenant and day. Hash joins do not care."""


async def records(scope: Scope, q: CostQuery) -> AsyncGenerator[Row[Any], None]:
    """The report's result rows, as PostgreSQL's cursor yields them: ``columns`` makes one a
    report row; its ``day`` is the local date of a row grouped by day (else None)."""
    async with scope() as session:
        await session.execute(CUSTOM_PLANS)
        await session.execute(WORK_MEM)
        await session.execute(NO_NESTED_LOOPS)
        result = await session.stream(cost_select(q).execution_options(yield_per=YIELD_PER))
        async for rows in result.partitions():  # a row at a time cost a greenlet switch each
            for row in rows:
                yield row


async def rows(scope: Scope, q: CostQuery) -> AsyncGenerator[dict[str, Any], None]:
    """The report's rows (``COLUMNS``), as PostgreSQL's cursor yields them."""
    async with aclosing(records(scope, q)) as result:
        async for row in result:
            yield columns(row)


async def spend(
    scope: Scope, actor: Actor, first: date, after: date, period: tuple[date, date]
) -> list[Row[Any]]:
    """Billed cost per currency and tenant-local day in ``[first, after)``, and per currency
    and tenant in ``period`` (``_query.spend_select``): the finance overview's charts."""
    require(actor, "reports")
    async with scope() as session:
        result = await session.execute(spend_select(first, after, period, actor.tenant_id))
        return list(result.all())


FORMULA = re.compile(r"[=+\-@\t\r]")
"""How a cell a spreadsheet would run as a formula starts (OWASP's CSV injection)."""
NUMBER = re.compile(r"-?\d+(\.\d+)?")


def cell(value: Any) -> Any:
    """A text cell a spreadsheet would read as a formula (a tenant named ``=HYPERLINK(…)``),
    quoted with a leading ``'`` so that it reads as text; numbers, negative ones too, as they
    are."""
    if isinstance(value, str) and FORMULA.match(value) and not NUMBER.fullmatch(value):
        return "'" + value
    return value


async def stream_csv(scope: Scope, q: CostQuery) -> AsyncIterator[bytes]:
    """The report as RFC 4180 CSV (header line first), in chunks; text cells that would run as
    formulas quoted (``cell``)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(COLUMNS)
    async for row in rows(scope, q):
        writer.writerow(map(cell, row.values()))
        if buffer.tell() >= CHUNK:
            yield buffer.getvalue().encode()
            buffer.seek(0)
            buffer.truncate()
    yield buffer.getvalue().encode()


async def stream_json(scope: Scope, q: CostQuery) -> AsyncIterator[bytes]:
    """``{"from", "to", "group_by", "columns", "rows": [...], "totals": [...]}``, in chunks."""
    head = {"from": q.start, "to": q.end, "group_by": sorted(q.groups), "columns": COLUMNS}
    parts = [msgspec.json.encode(head)[:-1] + b',"rows":[']
    first, pending, totals = True, 0, dict[str, list[int]]()
    async for row in rows(scope, q):
        sums = totals.setdefault(row["BillingCurrency"], [0, 0, 0])
        sums[0] += row["x_ListCostMicros"]
        sums[1] += row["x_BilledCostMicros"]
        sums[2] += row["x_Lines"]
        parts.append((b"" if first else b",") + msgspec.json.encode(row))
        first, pending = False, pending + len(parts[-1])
        if pending >= CHUNK:
            yield b"".join(parts)
            parts.clear()
            pending = 0
    parts.append(b'],"totals":' + msgspec.json.encode([_total(c, *s) for c, s in totals.items()]))
    yield b"".join(parts) + b"}"


def _total(currency: str, list_cost: int, cost: int, lines: int) -> dict[str, Any]:
    return {
        "BillingCurrency": currency, "ListCost": money(list_cost), "EffectiveCost": money(cost),
        "BilledCost": money(cost), "x_ListCostMicros": list_cost, "x_BilledCostMicros": cost,
        "x_Lines": lines,
    }  # fmt: skip
