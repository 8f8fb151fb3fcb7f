"""A tenant's outbound webhooks: register, rotate the secret, delete; each endpoint's delivery
log with redelivery (thin handlers over ``kiln_platform.webhooks.services``, which check the
role, the tenant and the SSRF guard)."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from litestar import Controller, get, post
from litestar.response import Template

from kiln_console import forms
from kiln_console.auth import AnyRequest, KilnDep, Viewer, ViewerDep
from kiln_platform.admin.deps import transaction
from kiln_platform.tenants.services import get_tenant
from kiln_platform.webhooks import guard, services, signing
from kiln_platform.webhooks.events import EVENT_TYPES
from kiln_platform.webhooks.schemas import EndpointCreate

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

    from kiln_platform.context import Kiln

ONE = "/tenants/{tenant_id:uuid}/webhooks/{webhook_id:uuid}"


class Webhooks(Controller):
    """``/console/tenants/{id}/webhooks``."""

    opt = {"resource": "webhooks"}  # noqa: RUF012 (auth.authorize reads it)

    @get("/tenants/{tenant_id:uuid}/webhooks")
    async def webhooks(self, kiln: KilnDep, viewer: ViewerDep, tenant_id: uuid.UUID) -> Template:
        """The tenant's endpoints, and the form that registers one."""
        async with transaction(kiln, viewer.actor) as session:
            context = await _endpoints(session, viewer, tenant_id)
        return Template("webhooks.html.j2", context=context)

    @post("/tenants/{tenant_id:uuid}/webhooks")
    async def create(
        self, request: AnyRequest, kiln: KilnDep, viewer: ViewerDep, tenant_id: uuid.UUID
    ) -> Template:
        """Register an endpoint: its secret is shown in this response only."""
        form = await request.form()
        fields = {"url": str(form.get("url", "")), "description": str(form.get("description", "")),
                  "events": form.getall("events") if "events" in form else []}  # fmt: skip
        data = forms.convert(fields, EndpointCreate)
        async with transaction(kiln, viewer.actor) as session:
            made = await services.create_endpoint(
                session, viewer.actor, tenant_id, data, seal=_seal(kiln),
                allow=guard.networks(kiln.settings.webhook_allow_networks),
            )  # fmt: skip
            context = {**await _endpoints(session, viewer, tenant_id), "made": made}
        return Template("_webhook_secret.html.j2", context=context, status_code=201)

    @post(ONE + "/rotate-secret")
    async def rotate(
        self, kiln: KilnDep, viewer: ViewerDep, tenant_id: uuid.UUID, webhook_id: uuid.UUID
    ) -> Template:
        """A new secret, shown once; the old one keeps signing for the grace period."""
        async with transaction(kiln, viewer.actor) as session:
            made = await services.rotate_secret(
                session, viewer.actor, tenant_id, webhook_id, seal=_seal(kiln),
                grace_s=kiln.settings.webhook_rotation_grace_s,
            )  # fmt: skip
            context = {**await _endpoints(session, viewer, tenant_id), "made": made}
        return Template("_webhook_secret.html.j2", context=context)

    @post(ONE + "/delete")
    async def delete(
        self, kiln: KilnDep, viewer: ViewerDep, tenant_id: uuid.UUID, webhook_id: uuid.UUID
    ) -> Template:
        """Delete an endpoint with its deliveries."""
        async with transaction(kiln, viewer.actor) as session:
            await services.delete_endpoint(session, viewer.actor, tenant_id, webhook_id)
            context = {**await _endpoints(session, viewer, tenant_id), "partial": True}
        return Template("_webhooks.html.j2", context=context)

    @get(ONE)
    async def deliveries(
        self, kiln: KilnDep, viewer: ViewerDep, tenant_id: uuid.UUID, webhook_id: uuid.UUID
    ) -> Template:
        """One endpoint's latest deliveries, each with its attempts."""
        async with transaction(kiln, viewer.actor) as session:
            context = await _deliveries(session, viewer, tenant_id, webhook_id)
        return Template("webhook.html.j2", context=context)

    @post(ONE + "/deliveries/{delivery_id:uuid}/redeliver")
    async def redeliver(
        self, kiln: KilnDep, viewer: ViewerDep, tenant_id: uuid.UUID, webhook_id: uuid.UUID,
        delivery_id: uuid.UUID,
    ) -> Template:  # fmt: skip
        """Send a delivery again (same webhook-id), within the next poll."""
        async with transaction(kiln, viewer.actor) as session:
            await services.redeliver(session, viewer.actor, tenant_id, webhook_id, delivery_id)
            context = {**await _deliveries(session, viewer, tenant_id, webhook_id),
                       "partial": True}  # fmt: skip
        return Template("_deliveries.html.j2", context=context)


def _seal(kiln: Kiln) -> Any:
    return signing.webhook_seal(kiln.settings.hmac_key())


async def _endpoints(session: AsyncSession, viewer: Viewer, tenant_id: uuid.UUID) -> dict[str, Any]:
    """The webhooks page's context, read in the caller's transaction (after its change)."""
    tenant = await get_tenant(session, viewer.actor, tenant_id)
    rows = await services.list_endpoints(session, viewer.actor, tenant_id)
    return {"viewer": viewer, "tenant": tenant, "endpoints": rows, "event_types": EVENT_TYPES}


async def _deliveries(
    session: AsyncSession, viewer: Viewer, tenant_id: uuid.UUID, webhook_id: uuid.UUID
) -> dict[str, Any]:
    tenant = await get_tenant(session, viewer.actor, tenant_id)
    endpoint = await services.get_endpoint(session, viewer.actor, tenant_id, webhook_id)
    rows = await services.list_deliveries(session, viewer.actor, tenant_id, webhook_id)
    return {"viewer": viewer, "tenant": tenant, "endpoint": endpoint, "deliveries": rows}
