"""Quota administration: a tenant's limits and per-key overrides (audited), and its budget."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import msgspec
from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert

from kiln_platform.admin.authz import Actor, require
from kiln_platform.audit.services import record
from kiln_platform.billing.budgets import period_of
from kiln_platform.billing.tables import BudgetEvent, BudgetPeriod
from kiln_platform.db.tables import Quota, Tenant
from kiln_platform.errors import BadRequest, NotFound
from kiln_platform.keys.services import find_key
from kiln_platform.quotas.schemas import (
    DEFAULT_ALERTS,
    BudgetEventView,
    BudgetView,
    KeyLimits,
    Limits,
    QuotaView,
)
from kiln_platform.tenants.services import get_tenant

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

FIELDS = (
    "rpm", "tpm", "concurrency", "monthly_budget_micros", "batch_tokens_per_day",
    "batch_enqueued_tokens",
)  # fmt: skip


def limits_of(row: Quota | None) -> Limits:
    """The limits of a row (none: no limits); alert thresholds only on a tenant's row."""
    if row is None:
        return Limits()
    alerts = list(row.budget_alert_percents) if row.api_key_id is None else None
    return Limits(**{f: getattr(row, f) for f in FIELDS}, budget_alert_percents=alerts)


async def get_quotas(session: AsyncSession, actor: Actor, tenant_id: uuid.UUID) -> QuotaView:
    """A tenant's limits, overrides, and this month's budget (spent, held, events)."""
    tenant = await get_tenant(session, actor, tenant_id)
    require(actor, "quotas")
    rows = list(await session.scalars(select(Quota).where(Quota.tenant_id == tenant_id)))
    limits = limits_of(next((r for r in rows if r.api_key_id is None), None))
    budget = await _budget(session, tenant, limits.monthly_budget_micros)
    return QuotaView(
        tenant_id=tenant_id,
        limits=limits,
        keys=[KeyLimits(r.api_key_id, limits_of(r)) for r in rows if r.api_key_id is not None],
        spent_this_month_micros=budget.spent_micros,
        budget=budget,
    )


async def _budget(session: AsyncSession, tenant: Tenant, limit: int | None) -> BudgetView:
    period = period_of(tenant.timezone, datetime.now(UTC))
    row = await session.get(BudgetPeriod, (tenant.id, period))
    events = await session.scalars(
        select(BudgetEvent)
        .where(BudgetEvent.tenant_id == tenant.id, BudgetEvent.period == period)
        .order_by(BudgetEvent.threshold_percent)
    )
    return BudgetView(
        period=period,
        timezone=tenant.timezone,
        spent_micros=row.spent_micros if row else 0,
        reserved_micros=row.reserved_micros if row else 0,
        limit_micros=limit,
        events=[
            BudgetEventView(e.period, e.threshold_percent, e.spent_micros, e.limit_micros,
                            e.created_at)
            for e in events
        ],
    )  # fmt: skip


async def set_limits(
    session: AsyncSession,
    actor: Actor,
    tenant_id: uuid.UUID,
    limits: Limits,
    key_id: uuid.UUID | None = None,
) -> Limits:
    """Replace the limits of a tenant, or of one of its keys (platform-admin)."""
    await get_tenant(session, actor, tenant_id)
    if key_id is not None:
        key = await find_key(session, actor, str(key_id), b"")
        if key.tenant_id != tenant_id:
            raise NotFound("No such API key.")
    require(actor, "quotas", write=True)
    if key_id is not None and limits.budget_alert_percents is not None:
        raise BadRequest(
            "'budget_alert_percents' belong to the tenant's limits, not to a key's.",
            param="budget_alert_percents",
        )
    where = (Quota.tenant_id == tenant_id) & (
        Quota.api_key_id.is_(None) if key_id is None else Quota.api_key_id == key_id
    )
    before = limits_of(await session.scalar(select(Quota).where(where)))
    values: dict[str, object] = {f: getattr(limits, f) for f in FIELDS}
    if key_id is None:
        alerts = sorted(set(limits.budget_alert_percents or DEFAULT_ALERTS))
        values["budget_alert_percents"] = alerts
        limits = msgspec.structs.replace(limits, budget_alert_percents=alerts)
    await session.execute(
        insert(Quota)
        .values(id=uuid.uuid4(), tenant_id=tenant_id, api_key_id=key_id, **values)
        .on_conflict_do_update(
            constraint="uq_quotas_tenant_id", set_={**values, "updated_at": datetime.now(UTC)}
        )
    )
    target, target_type = (key_id, "api_key") if key_id else (tenant_id, "tenant")
    await record(session, actor, "quota.set", target_type, target, tenant_id,
                 before=_dump(before), after=_dump(limits))  # fmt: skip
    return limits


def _dump(limits: Limits) -> dict[str, object]:
    return {f: getattr(limits, f) for f in (*FIELDS, "budget_alert_percents")}
