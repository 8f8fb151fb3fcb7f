"""Quota administration: a tenant's limits and per-key overrides (audited)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert

from kiln_platform.admin.authz import Actor, require
from kiln_platform.admin.services import find_key, get_tenant
from kiln_platform.audit.services import record
from kiln_platform.billing.tables import BudgetPeriod
from kiln_platform.db.tables import Quota
from kiln_platform.errors import NotFound
from kiln_platform.quotas.schemas import KeyLimits, Limits, QuotaView

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

FIELDS = ("rpm", "tpm", "concurrency", "monthly_budget_micros")


def limits_of(row: Quota | None) -> Limits:
    """The limits of a row (none: no limits)."""
    if row is None:
        return Limits()
    return Limits(**{f: getattr(row, f) for f in FIELDS})


def month_start(now: datetime | None = None) -> datetime:
    """The first instant of the current UTC month."""
    now = now or datetime.now(UTC)
    return now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


async def get_quotas(session: AsyncSession, actor: Actor, tenant_id: uuid.UUID) -> QuotaView:
    """A tenant's limits, overrides and spend."""
    await get_tenant(session, actor, tenant_id)
    require(actor, "quotas")
    rows = list(await session.scalars(select(Quota).where(Quota.tenant_id == tenant_id)))
    spent = await session.scalar(
        select(BudgetPeriod.spent_micros).where(
            BudgetPeriod.tenant_id == tenant_id, BudgetPeriod.period == month_start().date()
        )
    )
    return QuotaView(
        tenant_id=tenant_id,
        limits=limits_of(next((r for r in rows if r.api_key_id is None), None)),
        keys=[KeyLimits(r.api_key_id, limits_of(r)) for r in rows if r.api_key_id is not None],
        spent_this_month_micros=int(spent or 0),
    )


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
    where = (Quota.tenant_id == tenant_id) & (
        Quota.api_key_id.is_(None) if key_id is None else Quota.api_key_id == key_id
    )
    before = limits_of(await session.scalar(select(Quota).where(where)))
    values = {f: getattr(limits, f) for f in FIELDS}
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
    return {f: getattr(limits, f) for f in FIELDS}
