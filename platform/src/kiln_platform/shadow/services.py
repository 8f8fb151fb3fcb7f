"""A model's shadow config (set, removed, read with the comparison reports) and the reports'
persistence.

Platform-admin only (resource ``model-shadows``) and audited (``model.shadow``). Gateways read
the config from the Resolver's in-memory catalog: this one at once after the commit, others
within their 2 s refresh. Each gateway writes its own report every few seconds; a report not
written for ``STALE_AFTER`` is a gone gateway's (its key is host and process: each restart adds
one), ignored when read and deleted by the next save.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

import msgspec
from sqlalchemy import delete, func, select
from sqlalchemy.dialects.postgresql import insert

from kiln_platform.admin.authz import require
from kiln_platform.audit.services import record
from kiln_platform.db import after_commit
from kiln_platform.db.tables import Model
from kiln_platform.registry.resolver import load_shadows
from kiln_platform.registry.services import find_model, version_state
from kiln_platform.shadow.schemas import ShadowReport, ShadowUpdate, ShadowView
from kiln_platform.shadow.tables import ModelShadow
from kiln_platform.shadow.tables import ShadowReport as ReportRow

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterable, Sequence

    from sqlalchemy import ColumnElement, Select
    from sqlalchemy.ext.asyncio import AsyncSession

    from kiln_platform.admin.authz import Actor

RESOURCE = "model-shadows"
STALE_AFTER = timedelta(hours=1)
"""A report not written for this long is a gone gateway's (a live one writes every few s)."""


async def view(
    session: AsyncSession, actor: Actor, name: str, live: Sequence[ShadowReport] = ()
) -> ShadowView:
    """A model's shadow and every gateway's report (``live``: this gateway's, fresher than its
    persisted row)."""
    require(actor, RESOURCE)
    model = await find_model(session, name)
    row = await session.get(ModelShadow, model.id)
    stored = await session.execute(_report_rows().where(ReportRow.model_id == model.id))
    reports = _merge(stored.tuples(), live).get(name, [])
    if row is None:
        return ShadowView(model=name, reports=reports)
    return ShadowView(model=name, version=row.version, percent=row.percent, reports=reports)


async def views(
    session: AsyncSession, actor: Actor, live: Sequence[ShadowReport] = ()
) -> dict[str, ShadowView]:
    """Every model with a shadow or a report, by name (two queries; the console's Models
    page)."""
    require(actor, RESOURCE)
    found = {
        name: ShadowView(model=name, version=shadow.version, percent=shadow.percent)
        for name, shadow in (await load_shadows(session)).items()
    }
    stored = await session.execute(_report_rows())
    for name, reports in _merge(stored.tuples(), live).items():
        found.setdefault(name, ShadowView(model=name)).reports = reports
    return found


def _report_rows() -> Select[str, ReportRow]:
    """The fresh reports with their model's name, by model and candidate."""
    return (
        select(Model.name, ReportRow).join(ReportRow, ReportRow.model_id == Model.id)
        .where(_fresh()).order_by(Model.name, ReportRow.candidate)
    )  # fmt: skip


def _merge(
    rows: Iterable[tuple[str, ReportRow]], live: Sequence[ShadowReport]
) -> dict[str, list[ShadowReport]]:
    """The stored reports by model name, a ``live`` one in place of its own gateway's row (it is
    fresher); live ones not stored yet come last."""
    mine = {(r.model, r.candidate, r.gateway): r for r in live}
    found: dict[str, list[ShadowReport]] = {}
    for name, row in rows:
        report = mine.pop((name, row.candidate, row.gateway), None) or _stored(row)
        found.setdefault(name, []).append(report)
    for left in mine.values():
        found.setdefault(left.model, []).append(left)
    return found


async def set_shadow(
    session: AsyncSession, actor: Actor, name: str, data: ShadowUpdate,
    *, reconcile: Callable[[], Awaitable[object]] | None = None,
) -> ShadowView:  # fmt: skip
    """Copy ``data.percent`` of ``name``'s requests to ``data.version`` (its pool is started)."""
    require(actor, RESOURCE, write=True)
    model = await find_model(session, name)
    await version_state(session, model, data.version, "version")
    before = await session.get(ModelShadow, model.id)
    was = None if before is None else {"version": before.version, "percent": before.percent}
    after = {"version": data.version, "percent": data.percent}
    await session.execute(
        insert(ModelShadow).values(model_id=model.id, **after)
        .on_conflict_do_update(index_elements=["model_id"], set_=after)
    )  # fmt: skip
    await record(session, actor, "model.shadow", "model", model.id, None, before=was, after=after)
    if reconcile is not None:
        after_commit.defer(session, reconcile)
    return ShadowView(model=name, version=data.version, percent=data.percent)


async def delete_shadow(
    session: AsyncSession, actor: Actor, name: str,
    *, reconcile: Callable[[], Awaitable[object]] | None = None,
) -> None:  # fmt: skip
    """Stop copying ``name``'s requests (the reports stay until the model is deleted)."""
    require(actor, RESOURCE, write=True)
    model = await find_model(session, name)
    row = await session.get(ModelShadow, model.id)
    if row is None:
        return
    was = {"version": row.version, "percent": row.percent}
    await session.execute(delete(ModelShadow).where(ModelShadow.model_id == model.id))
    await record(session, actor, "model.shadow.delete", "model", model.id, None, before=was)
    if reconcile is not None:
        after_commit.defer(session, reconcile)


async def persist(session: AsyncSession, reports: Sequence[ShadowReport]) -> None:
    """Write a gateway's reports (one row per model, candidate and gateway); delete the stale
    ones (gone gateways')."""
    await session.execute(delete(ReportRow).where(~_fresh()))
    for r in reports:
        model_id = select(Model.id).where(Model.name == r.model).scalar_subquery()
        body = msgspec.json.decode(msgspec.json.encode(r))  # an infinite diff becomes null
        await session.execute(
            insert(ReportRow).values(model_id=model_id, candidate=r.candidate, gateway=r.gateway,
                                     report=body)
            .on_conflict_do_update(index_elements=["model_id", "candidate", "gateway"],
                                   set_={"report": body, "updated_at": func.now()})
        )  # fmt: skip


def _fresh() -> ColumnElement[bool]:
    return ReportRow.updated_at > func.now() - STALE_AFTER


def _stored(row: ReportRow) -> ShadowReport:
    return msgspec.structs.replace(
        msgspec.convert(row.report, ShadowReport), updated_at=row.updated_at
    )
