"""The append-only audit log: one record per admin mutation, written in its transaction."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import msgspec
from sqlalchemy import select

from kiln_platform.admin.authz import Actor, require
from kiln_platform.audit.schemas import AuditPage, AuditView
from kiln_platform.db.tables import AuditRecord
from kiln_platform.db.views import view_of

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

MAX_PAGE = 200


def snapshot(obj: Any, *fields: str) -> dict[str, Any]:
    """A JSON-able picture of some fields of a row (for ``before`` / ``after``)."""
    return {f: msgspec.to_builtins(getattr(obj, f)) for f in fields}


async def record(  # noqa: PLR0917 (one audit record reads best positionally)
    session: AsyncSession,
    actor: Actor,
    action: str,
    target_type: str,
    target_id: object,
    tenant_id: uuid.UUID | None,
    *,
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
) -> None:
    """Append one record in the caller's transaction (so it commits iff the change does)."""
    session.add(
        AuditRecord(
            actor=actor.name,
            actor_role=str(actor.role),
            tenant_id=tenant_id,
            action=action,
            target_type=target_type,
            target_id=str(target_id),
            before=before,
            after=after,
            request_id=actor.request_id,
            source=actor.source,
        )
    )
    await session.flush()


@dataclass(frozen=True, slots=True)
class AuditFilter:
    """Optional filters of ``GET /admin/v1/audit``."""

    tenant_id: uuid.UUID | None = None
    actor: str | None = None
    action: str | None = None
    target_type: str | None = None
    target_id: str | None = None
    request_id: str | None = None
    since: datetime | None = None
    until: datetime | None = None


async def list_records(
    session: AsyncSession, actor: Actor, where: AuditFilter, cursor: int | None, limit: int
) -> AuditPage:
    """Records visible to the actor, newest first, keyset-paginated by id."""
    require(actor, "audit")
    query = select(AuditRecord).order_by(AuditRecord.id.desc()).limit(min(limit, MAX_PAGE) + 1)
    tenant = actor.tenant_id if actor.tenant_id is not None else where.tenant_id
    if actor.tenant_id is not None and where.tenant_id not in (None, actor.tenant_id):
        return AuditPage(data=[], next_cursor=None)
    if tenant is not None:
        query = query.where(AuditRecord.tenant_id == tenant)
    for column, value in (
        (AuditRecord.actor, where.actor),
        (AuditRecord.action, where.action),
        (AuditRecord.target_type, where.target_type),
        (AuditRecord.target_id, where.target_id),
        (AuditRecord.request_id, where.request_id),
    ):
        if value is not None:
            query = query.where(column == value)
    if where.since is not None:
        query = query.where(AuditRecord.created_at >= where.since)
    if where.until is not None:
        query = query.where(AuditRecord.created_at < where.until)
    if cursor is not None:
        query = query.where(AuditRecord.id < cursor)
    rows = list((await session.scalars(query)).all())
    page = rows[: min(limit, MAX_PAGE)]
    more = len(rows) > len(page)
    data = [view_of(AuditView, r) for r in page]
    return AuditPage(data=data, next_cursor=page[-1].id if more and page else None)
