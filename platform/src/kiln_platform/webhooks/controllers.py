"""`/admin/v1/tenants/{id}/webhooks`: thin handlers, behaviour in ``webhooks.services``."""

from __future__ import annotations

import uuid

from litestar import delete, get, patch, post

from kiln_platform.admin.deps import AdminCall, AdminController, CallDep
from kiln_platform.webhooks import guard, services, signing
from kiln_platform.webhooks.schemas import (
    DeliveryView,
    EndpointCreate,
    EndpointSecret,
    EndpointUpdate,
    EndpointView,
)

ONE = "/tenants/{tenant_id:uuid}/webhooks/{webhook_id:uuid}"


def _allow(call: AdminCall) -> tuple[guard.Network, ...]:
    return guard.networks(call.kiln.settings.webhook_allow_networks)


class WebhooksController(AdminController):
    """A tenant's webhook endpoints, their secrets and their delivery log."""

    opt = {"resource": "webhooks"}  # noqa: RUF012 (admin.deps.authorize reads it)

    @get("/tenants/{tenant_id:uuid}/webhooks")
    async def list_webhooks(self, call: CallDep, tenant_id: uuid.UUID) -> list[EndpointView]:
        """The tenant's endpoints (never a secret)."""
        return await services.list_endpoints(await call.session(), call.actor, tenant_id)

    @post("/tenants/{tenant_id:uuid}/webhooks")
    async def create_webhook(
        self, call: CallDep, tenant_id: uuid.UUID, data: EndpointCreate
    ) -> EndpointSecret:
        """Register an endpoint (400 for a private address); its secret is shown once."""
        seal = signing.webhook_seal(call.hmac_key)
        return await services.create_endpoint(
            await call.session(), call.actor, tenant_id, data, seal=seal, allow=_allow(call)
        )

    @patch(ONE)
    async def update_webhook(
        self, call: CallDep, tenant_id: uuid.UUID, webhook_id: uuid.UUID, data: EndpointUpdate
    ) -> EndpointView:
        """Change the URL, events, description, or enable/disable the endpoint."""
        return await services.update_endpoint(
            await call.session(), call.actor, tenant_id, webhook_id, data, allow=_allow(call)
        )

    @delete(ONE)
    async def delete_webhook(
        self, call: CallDep, tenant_id: uuid.UUID, webhook_id: uuid.UUID
    ) -> None:
        """Delete the endpoint, its pending deliveries and their log."""
        await services.delete_endpoint(await call.session(), call.actor, tenant_id, webhook_id)

    @post(ONE + "/rotate-secret")
    async def rotate_secret(
        self, call: CallDep, tenant_id: uuid.UUID, webhook_id: uuid.UUID
    ) -> EndpointSecret:
        """A new secret (shown once); the old one signs too for KILN_WEBHOOK_ROTATION_GRACE_S."""
        seal = signing.webhook_seal(call.hmac_key)
        grace = call.kiln.settings.webhook_rotation_grace_s
        return await services.rotate_secret(
            await call.session(), call.actor, tenant_id, webhook_id, seal=seal, grace_s=grace
        )

    @get(ONE + "/deliveries")
    async def list_deliveries(
        self, call: CallDep, tenant_id: uuid.UUID, webhook_id: uuid.UUID
    ) -> list[DeliveryView]:
        """The latest 50 deliveries, newest first, each with every attempt."""
        return await services.list_deliveries(
            await call.session(), call.actor, tenant_id, webhook_id
        )

    @post(ONE + "/deliveries/{delivery_id:uuid}/redeliver")
    async def redeliver(
        self, call: CallDep, tenant_id: uuid.UUID, webhook_id: uuid.UUID, delivery_id: uuid.UUID
    ) -> DeliveryView:
        """Send the delivery again now, with the same webhook-id."""
        return await services.redeliver(
            await call.session(), call.actor, tenant_id, webhook_id, delivery_id
        )
