"""Tenants' webhook endpoints (tenant-admin, audited): register, change, delete, rotate the
secret; read the delivery log; redeliver. Every URL passes the SSRF guard first."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from cryptography.exceptions import InvalidTag
from sqlalchemy import select

from kiln_platform.admin.authz import Actor, check_tenant, require
from kiln_platform.audit.services import record, snapshot
from kiln_platform.db.tables import Tenant
from kiln_platform.errors import NotFound
from kiln_platform.webhooks import guard, signing
from kiln_platform.webhooks.schemas import (
    AttemptView,
    DeliveryView,
    EndpointCreate,
    EndpointSecret,
    EndpointUpdate,
    EndpointView,
)
from kiln_platform.webhooks.tables import WebhookAttempt, WebhookDelivery, WebhookEndpoint

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

    from kiln_platform.sealing import Seal

RESOURCE = "webhooks"
AUDITED = ("url", "events", "description", "enabled")


def view(row: WebhookEndpoint) -> EndpointView:
    """An endpoint as listed (never a secret)."""
    return EndpointView(
        id=row.id, tenant_id=row.tenant_id, url=row.url, events=list(row.events),
        description=row.description, enabled=row.enabled, created_at=row.created_at,
        previous_secret_until=row.previous_until,
    )  # fmt: skip


async def _endpoint(
    session: AsyncSession, actor: Actor, tenant_id: uuid.UUID, endpoint_id: uuid.UUID
) -> WebhookEndpoint:
    check_tenant(actor, tenant_id, "tenant")
    row = await session.get(WebhookEndpoint, endpoint_id)
    if row is None or row.tenant_id != tenant_id:
        raise NotFound("No such webhook.")
    return row


async def create_endpoint(
    session: AsyncSession, actor: Actor, tenant_id: uuid.UUID, data: EndpointCreate, *, seal: Seal,
    allow: tuple[guard.Network, ...],
) -> EndpointSecret:  # fmt: skip
    """Register an endpoint; its ``whsec_`` secret is returned once and stored sealed."""
    require(actor, RESOURCE, write=True)
    check_tenant(actor, tenant_id, "tenant")
    if await session.get(Tenant, tenant_id) is None:
        raise NotFound("No such tenant.")
    await guard.screen(data.url, allow)
    secret, eid = signing.new_secret(), uuid.uuid4()
    row = WebhookEndpoint(
        id=eid, tenant_id=tenant_id, url=data.url, events=sorted(set(data.events)),
        description=data.description, secret_sealed=signing.seal_secret(seal, eid, secret),
    )  # fmt: skip
    session.add(row)
    await session.flush()
    await session.refresh(row)
    await record(session, actor, "webhook.create", "webhook", eid, tenant_id,
                 after=snapshot(row, *AUDITED))  # fmt: skip
    return EndpointSecret(view(row), secret)


async def list_endpoints(
    session: AsyncSession, actor: Actor, tenant_id: uuid.UUID
) -> list[EndpointView]:
    """The tenant's endpoints, oldest first."""
    require(actor, RESOURCE)
    check_tenant(actor, tenant_id, "tenant")
    rows = await session.scalars(
        select(WebhookEndpoint)
        .where(WebhookEndpoint.tenant_id == tenant_id)
        .order_by(WebhookEndpoint.created_at, WebhookEndpoint.id)
    )
    return [view(r) for r in rows]


async def get_endpoint(
    session: AsyncSession, actor: Actor, tenant_id: uuid.UUID, endpoint_id: uuid.UUID
) -> EndpointView:
    """One of the tenant's endpoints."""
    require(actor, RESOURCE)
    return view(await _endpoint(session, actor, tenant_id, endpoint_id))


async def update_endpoint(
    session: AsyncSession, actor: Actor, tenant_id: uuid.UUID, endpoint_id: uuid.UUID,
    data: EndpointUpdate, *, allow: tuple[guard.Network, ...],
) -> EndpointView:  # fmt: skip
    """Change an endpoint's URL (guarded again), events, description or whether it is enabled."""
    require(actor, RESOURCE, write=True)
    row = await _endpoint(session, actor, tenant_id, endpoint_id)
    before = snapshot(row, *AUDITED)
    if data.url is not None:
        await guard.screen(data.url, allow)
        row.url = data.url
    if data.events is not None:
        row.events = sorted(set(data.events))
    if data.description is not None:
        row.description = data.description
    if data.enabled is not None:
        row.enabled = data.enabled
    await session.flush()
    await record(session, actor, "webhook.update", "webhook", row.id, tenant_id, before=before,
                 after=snapshot(row, *AUDITED))  # fmt: skip
    return view(row)


async def delete_endpoint(
    session: AsyncSession, actor: Actor, tenant_id: uuid.UUID, endpoint_id: uuid.UUID
) -> None:
    """Delete an endpoint with its deliveries and their log."""
    require(actor, RESOURCE, write=True)
    row = await _endpoint(session, actor, tenant_id, endpoint_id)
    before = snapshot(row, *AUDITED)
    await session.delete(row)
    await record(session, actor, "webhook.delete", "webhook", row.id, tenant_id, before=before)


async def rotate_secret(
    session: AsyncSession, actor: Actor, tenant_id: uuid.UUID, endpoint_id: uuid.UUID,
    *, seal: Seal, grace_s: float,
) -> EndpointSecret:  # fmt: skip
    """A new secret (shown once); the old one still signs, beside it, for ``grace_s``."""
    require(actor, RESOURCE, write=True)
    row = await _endpoint(session, actor, tenant_id, endpoint_id)
    try:
        old: str | None = seal.open(row.secret_sealed, signing.identity(row.id)).decode()
    except (InvalidTag, ValueError):  # sealed under another server secret: nothing to keep
        old = None
    secret = signing.new_secret()
    row.secret_sealed = signing.seal_secret(seal, row.id, secret)
    row.previous_sealed = None if old is None else signing.seal_secret(
        seal, row.id, old, previous=True
    )  # fmt: skip
    row.previous_until = None if old is None else datetime.now(UTC) + timedelta(seconds=grace_s)
    await session.flush()
    until = row.previous_until.isoformat() if row.previous_until else None
    await record(session, actor, "webhook.rotate-secret", "webhook", row.id, tenant_id,
                 after={"previous_until": until})  # fmt: skip
    return EndpointSecret(view(row), secret)


def _delivery(row: WebhookDelivery, log: list[WebhookAttempt]) -> DeliveryView:
    return DeliveryView(
        id=row.id, webhook_id=signing.message_id(row.id), event_type=row.event_type,
        state=row.state, attempts=row.attempts, last_code=row.last_code,
        created_at=row.created_at,
        next_attempt_at=row.next_attempt_at if row.state == "pending" else None,
        delivered_at=row.delivered_at, payload=row.payload,
        log=[AttemptView(a.at, a.outcome, a.response_code, a.duration_ms, a.error) for a in log],
    )  # fmt: skip


async def list_deliveries(
    session: AsyncSession, actor: Actor, tenant_id: uuid.UUID, endpoint_id: uuid.UUID,
    limit: int = 50,
) -> list[DeliveryView]:  # fmt: skip
    """The endpoint's latest deliveries, newest first, each with its attempts."""
    require(actor, RESOURCE)
    await _endpoint(session, actor, tenant_id, endpoint_id)
    rows = list(await session.scalars(
        select(WebhookDelivery).where(WebhookDelivery.endpoint_id == endpoint_id)
        .order_by(WebhookDelivery.created_at.desc(), WebhookDelivery.id).limit(limit)
    ))  # fmt: skip
    attempts = await session.scalars(
        select(WebhookAttempt)
        .where(WebhookAttempt.delivery_id.in_([r.id for r in rows]))
        .order_by(WebhookAttempt.at, WebhookAttempt.id)
    )
    log: dict[uuid.UUID, list[WebhookAttempt]] = {r.id: [] for r in rows}
    for attempt in attempts:
        log[attempt.delivery_id].append(attempt)
    return [_delivery(r, log[r.id]) for r in rows]


async def redeliver(
    session: AsyncSession, actor: Actor, tenant_id: uuid.UUID, endpoint_id: uuid.UUID,
    delivery_id: uuid.UUID,
) -> DeliveryView:  # fmt: skip
    """Send a delivery again now, with the same ``webhook-id`` (a new retry window)."""
    require(actor, RESOURCE, write=True)
    await _endpoint(session, actor, tenant_id, endpoint_id)
    row = await session.get(WebhookDelivery, delivery_id, with_for_update=True)
    if row is None or row.endpoint_id != endpoint_id:
        raise NotFound("No such delivery.")
    now = datetime.now(UTC)
    row.state, row.next_attempt_at, row.window_from = "pending", now, now
    await session.flush()
    await record(session, actor, "webhook.redeliver", "webhook-delivery", row.id, tenant_id)
    return _delivery(row, [])
