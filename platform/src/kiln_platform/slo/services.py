"""SLO administration (audited) and what an SLO's status and alerts read."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError

from kiln_platform.admin.authz import Actor, require
from kiln_platform.audit.services import record, snapshot
from kiln_platform.errors import Conflict, NotFound
from kiln_platform.slo import policy
from kiln_platform.slo.policy import Counts, Objective, Sli
from kiln_platform.slo.schemas import AlertView, SliStatus, SloCreate, SloStatus, SloView
from kiln_platform.slo.tables import Alert, Slo, SloCount

if TYPE_CHECKING:
    from collections.abc import Sequence

    from sqlalchemy.ext.asyncio import AsyncSession

FIELDS = ("name", "model", "plan", "availability", "latency", "latency_ms", "period_s")
MAX_ALERTS = 200


def view(slo: Slo) -> SloView:
    """The wire form of a stored SLO."""
    return SloView(
        id=slo.id, name=slo.name, model=slo.model, plan=slo.plan,
        availability=slo.availability, latency=slo.latency, latency_ms=slo.latency_ms,
        period_days=slo.period_s / policy.DAY_S, created_at=slo.created_at,
    )  # fmt: skip


def objective(slo: Slo) -> Objective:
    """What the policy needs of a stored SLO."""
    return Objective(slo.model, slo.availability, slo.latency, slo.latency_ms, slo.period_s)


async def create_slo(session: AsyncSession, actor: Actor, data: SloCreate) -> SloView:
    """Store a new SLO (platform-admin); its events are counted from the next interval on."""
    require(actor, "slos", write=True)
    if data.availability is None and data.latency is None:
        raise Conflict("An SLO needs an availability or a latency objective (or both).")
    slo = Slo(
        name=data.name, model=data.model, plan=data.plan, availability=data.availability,
        latency=data.latency, latency_ms=data.latency_ms, period_s=data.period_days * policy.DAY_S,
    )  # fmt: skip
    session.add(slo)
    try:
        await session.flush()
    except IntegrityError:
        raise Conflict(f"An SLO named '{data.name}' already exists.") from None
    await session.refresh(slo)
    await record(session, actor, "slo.create", "slo", slo.id, None, after=snapshot(slo, *FIELDS))
    return view(slo)


async def stored_slos(session: AsyncSession, actor: Actor) -> list[Slo]:
    """Every SLO's row, by name."""
    require(actor, "slos")
    return list(await session.scalars(select(Slo).order_by(Slo.name)))


async def list_slos(session: AsyncSession, actor: Actor) -> list[SloView]:
    """Every SLO, by name."""
    return [view(s) for s in await stored_slos(session, actor)]


async def _find(session: AsyncSession, name: str) -> Slo:
    slo = await session.scalar(select(Slo).where(Slo.name == name))
    if slo is None:
        raise NotFound(f"No SLO named '{name}'.")
    return slo


async def delete_slo(session: AsyncSession, actor: Actor, name: str) -> None:
    """Delete an SLO and its counts (its alerts stay in the history)."""
    require(actor, "slos", write=True)
    slo = await _find(session, name)
    before = snapshot(slo, *FIELDS)
    await session.delete(slo)
    await record(session, actor, "slo.delete", "slo", slo.id, None, before=before)


async def window_counts(
    session: AsyncSession, slo_id: uuid.UUID, spans: Sequence[float], bucket_s: float, now: datetime
) -> dict[float, Counts]:
    """Events in each window ending at ``now`` (a bucket counts if it overlaps the window)."""
    columns = []
    for span in spans:
        inside = SloCount.bucket > now - timedelta(seconds=span + bucket_s)
        columns += [
            func.coalesce(func.sum(getattr(SloCount, c)).filter(inside), 0)
            for c in ("total", "errors", "slow")
        ]
    since = now - timedelta(seconds=max(spans) + bucket_s)
    row = (
        await session.execute(
            select(*columns).where(SloCount.slo_id == slo_id, SloCount.bucket > since)
        )
    ).one()
    return {span: Counts(*map(int, row[3 * i : 3 * i + 3])) for i, span in enumerate(spans)}


async def slo_status(session: AsyncSession, actor: Actor, name: str, bucket_s: float) -> SloStatus:
    """An SLO's budget left over its period and its burn rate in every alert window."""
    require(actor, "slos")
    return await _status(session, await _find(session, name), bucket_s)


async def slo_statuses(session: AsyncSession, actor: Actor, bucket_s: float) -> list[SloStatus]:
    """Every SLO's status (``slo_status``), by name."""
    return [await _status(session, slo, bucket_s) for slo in await stored_slos(session, actor)]


async def _status(session: AsyncSession, slo: Slo, bucket_s: float) -> SloStatus:
    goal, now = objective(slo), datetime.now(UTC)
    spans = policy.windows(goal)
    counts = await window_counts(session, slo.id, spans, bucket_s, now)
    slis = []
    for sli in Sli:
        target = goal.target(sli)
        if target is None:
            continue
        whole = counts[goal.period_s]
        slis.append(
            SliStatus(
                sli=str(sli), objective=target, total=whole.total, bad=whole.bad(sli),
                budget_remaining=policy.budget_remaining(whole, sli, target),
                burn_rates={f"{s:g}": policy.burn_rate(counts[s], sli, target) for s in spans},
            )
        )  # fmt: skip
    firing = await session.scalars(
        select(Alert.name).where(Alert.status == "firing", Alert.labels["slo"].astext == slo.name)
    )
    return SloStatus(slo=view(slo), slis=slis, firing=list(firing))


async def list_alerts(session: AsyncSession, actor: Actor, status: str | None) -> list[AlertView]:
    """The latest alerts (firing and resolved), newest first."""
    require(actor, "alerts")
    query = select(Alert).order_by(Alert.starts_at.desc()).limit(MAX_ALERTS)
    if status is not None:
        query = query.where(Alert.status == status)
    return [
        AlertView(a.id, a.name, a.status, a.fingerprint, a.labels, a.annotations, a.starts_at,
                  a.ends_at)
        for a in await session.scalars(query)
    ]  # fmt: skip
