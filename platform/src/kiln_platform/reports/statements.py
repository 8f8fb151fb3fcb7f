"""Monthly statements (closed once, immutable) and adjustments (corrections as new lines).

A statement's period is a calendar month in the tenant's time zone; it totals the charge lines
charged in it, adjustments included. A correction never edits a closed month: it is a new
``usage_charges`` line (``kind='adjustment'``) charged now, in the open period, naming the month
it corrects.
"""

from __future__ import annotations

import re
import uuid
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError

from kiln_platform.admin.authz import Actor, require
from kiln_platform.audit.services import record, snapshot
from kiln_platform.billing.budgets import period_end
from kiln_platform.billing.tables import PriceBook, Statement, UsageCharge
from kiln_platform.errors import BadRequest, Conflict, NotFound
from kiln_platform.reports.formats import money
from kiln_platform.reports.schemas import AdjustmentCreate, AdjustmentView, StatementView, month
from kiln_platform.tenants.services import get_tenant

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

CLOSE_GRACE = timedelta(minutes=15)
"""How long after a month ends it may be closed: requests in flight at midnight get recorded."""
STATEMENT_FIELDS = ("period", "currency", "list_cost_micros", "cost_micros", "lines")
_PERIOD = re.compile(r"^(\d{4})-(0[1-9]|1[0-2])$")


def period_of(text: str) -> date:
    """``YYYY-MM`` as the first day of that month (else 400 naming ``period``)."""
    match = _PERIOD.match(text)
    if match is None:
        raise BadRequest(f"A period reads YYYY-MM, not {text!r}.", param="period")
    return date(int(match[1]), int(match[2]), 1)


def month_range(period: date, timezone: str) -> tuple[datetime, datetime]:
    """``[start, end)`` of a calendar month in a time zone."""
    start = datetime(period.year, period.month, 1, tzinfo=ZoneInfo(timezone))
    return start, period_end(timezone, period)


async def close_statement(
    session: AsyncSession, actor: Actor, tenant_id: uuid.UUID, period_text: str
) -> StatementView:
    """Close a month that is over: its totals become an immutable row (twice: 409)."""
    tenant = await get_tenant(session, actor, tenant_id)
    require(actor, "statements", write=True)
    period = period_of(period_text)
    start, end = month_range(period, tenant.timezone)
    if datetime.now(UTC) < end + CLOSE_GRACE:
        raise Conflict(f"{period_text} ({tenant.timezone}) is not over: it can be closed from "
                       f"{(end + CLOSE_GRACE).astimezone(UTC).isoformat()}.")  # fmt: skip
    if await _find(session, tenant_id, period) is not None:
        raise Conflict(f"The statement of {period_text} is already closed.")
    totals = await _totals(session, tenant_id, start, end)
    if len(totals) > 1:
        raise Conflict(f"{period_text} has charges in several currencies; it cannot be closed.")
    currency, list_cost, cost, lines = totals[0] if totals else (await _currency(session), 0, 0, 0)
    row = Statement(tenant_id=tenant_id, period=period, currency=currency,
                    list_cost_micros=list_cost, cost_micros=cost, lines=lines,
                    closed_by=actor.name)  # fmt: skip
    session.add(row)
    try:
        await session.flush()
    except IntegrityError as exc:  # closed concurrently
        raise Conflict(f"The statement of {period_text} is already closed.") from exc
    await session.refresh(row)
    await record(session, actor, "statement.close", "statement", row.id, tenant_id,
                 after=snapshot(row, *STATEMENT_FIELDS))  # fmt: skip
    return statement_view(row)


async def list_statements(
    session: AsyncSession, actor: Actor, tenant_id: uuid.UUID
) -> list[StatementView]:
    """A tenant's closed statements, newest period first."""
    await get_tenant(session, actor, tenant_id)
    require(actor, "statements")
    rows = await session.scalars(
        select(Statement).where(Statement.tenant_id == tenant_id).order_by(Statement.period.desc())
    )
    return [statement_view(s) for s in rows]


async def statements_in(
    session: AsyncSession, actor: Actor, first: date, last: date, tenant_id: uuid.UUID | None
) -> list[StatementView]:
    """Closed statements of months ``first`` to ``last`` (inclusive), of every tenant the actor
    may see (or ``tenant_id``'s), oldest month first: the months missing are still open."""
    require(actor, "statements")
    query = select(Statement).where(Statement.period >= first, Statement.period <= last)
    tenant = actor.tenant_id or tenant_id
    if tenant is not None:
        query = query.where(Statement.tenant_id == tenant)
    rows = await session.scalars(query.order_by(Statement.period, Statement.tenant_id).limit(1000))
    return [statement_view(s) for s in rows]


async def get_statement(
    session: AsyncSession, actor: Actor, tenant_id: uuid.UUID, period_text: str
) -> StatementView:
    """One closed statement (404 while the month is open)."""
    await get_tenant(session, actor, tenant_id)
    require(actor, "statements")
    row = await _find(session, tenant_id, period_of(period_text))
    if row is None:
        raise NotFound(f"No closed statement for {period_text}.")
    return statement_view(row)


async def create_adjustment(
    session: AsyncSession, actor: Actor, tenant_id: uuid.UUID, data: AdjustmentCreate
) -> AdjustmentView:
    """Charge a correction now (a credit if negative), as a separate, audited charge line."""
    await get_tenant(session, actor, tenant_id)
    require(actor, "adjustments", write=True)
    if data.amount_micros == 0:
        raise BadRequest("An adjustment's amount may not be zero.", param="amount_micros")
    line = UsageCharge(
        kind="adjustment", request_id=f"adj_{uuid.uuid4().hex}", tenant_id=tenant_id,
        model="*", version="*", unit="request", quantity=Decimal(0),
        unit_price_micros=Decimal(0), list_cost_micros=data.amount_micros,
        cost_micros=data.amount_micros, currency=await _currency(session),
        charged_at=datetime.now(UTC), corrects_period=period_of(data.corrects_period),
        reason=data.reason,
    )  # fmt: skip
    session.add(line)
    await session.flush()
    view = adjustment_view(line)
    await record(session, actor, "adjustment.create", "usage_charge", line.id, tenant_id,
                 after={"amount_micros": view.amount_micros, "reason": view.reason,
                        "corrects_period": view.corrects_period})  # fmt: skip
    return view


async def _totals(
    session: AsyncSession, tenant_id: uuid.UUID, start: datetime, end: datetime
) -> list[tuple[str, int, int, int]]:
    """(currency, list cost, cost, lines) of a tenant's charge lines in ``[start, end)``."""
    c = UsageCharge
    query = (
        select(c.currency, func.sum(c.list_cost_micros), func.sum(c.cost_micros), func.count())
        .where(c.tenant_id == tenant_id, c.charged_at >= start, c.charged_at < end)
        .group_by(c.currency)
    )
    return [(cur, int(lst), int(cost), n) for cur, lst, cost, n in await session.execute(query)]


async def _find(session: AsyncSession, tenant_id: uuid.UUID, period: date) -> Statement | None:
    return await session.scalar(
        select(Statement).where(Statement.tenant_id == tenant_id, Statement.period == period)
    )


async def _currency(session: AsyncSession) -> str:
    """The currency of the price book in effect now (USD without one)."""
    book = await session.scalar(
        select(PriceBook.currency).where(PriceBook.effective_from <= func.now())
        .order_by(PriceBook.effective_from.desc(), PriceBook.version.desc()).limit(1)
    )  # fmt: skip
    return book or "USD"


def statement_view(s: Statement) -> StatementView:
    """Wire form of a statement."""
    return StatementView(
        id=s.id, tenant_id=s.tenant_id, period=month(s.period), currency=s.currency,
        list_cost_micros=s.list_cost_micros, cost_micros=s.cost_micros,
        list_cost=money(s.list_cost_micros), cost=money(s.cost_micros), lines=s.lines,
        closed_at=s.closed_at, closed_by=s.closed_by,
    )  # fmt: skip


def adjustment_view(c: UsageCharge) -> AdjustmentView:
    """Wire form of an adjustment line."""
    return AdjustmentView(
        id=c.id, request_id=c.request_id, tenant_id=c.tenant_id, amount_micros=c.cost_micros,
        amount=money(c.cost_micros), currency=c.currency, reason=c.reason or "",
        corrects_period=month(c.corrects_period or date.min), charged_at=c.charged_at,
    )  # fmt: skip
