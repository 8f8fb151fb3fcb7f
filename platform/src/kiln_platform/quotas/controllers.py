"""`/admin/v1/quotas`: thin handlers, behaviour in ``quotas.services``."""

from __future__ import annotations

import uuid

from litestar import get, put

from kiln_platform.admin.deps import AdminController, CallDep
from kiln_platform.quotas import services
from kiln_platform.quotas.schemas import Limits, QuotaView


class QuotasController(AdminController):
    """Plans and quotas: requests/min, tokens/min, concurrency, monthly budget, batches."""

    opt = {"resource": "quotas"}  # noqa: RUF012 (admin.deps.authorize reads it)

    @get("/quotas/{tenant_id:uuid}")
    async def get_quotas(self, call: CallDep, tenant_id: uuid.UUID) -> QuotaView:
        """A tenant's limits, per-key overrides, and this month's spend."""
        return await services.get_quotas(await call.session(), call.actor, tenant_id)

    @put("/quotas/{tenant_id:uuid}")
    async def set_quotas(self, call: CallDep, tenant_id: uuid.UUID, data: Limits) -> Limits:
        """Replace a tenant's limits (platform-admin; effective everywhere within 5 s)."""
        return await services.set_limits(await call.session(), call.actor, tenant_id, data)

    @put("/quotas/{tenant_id:uuid}/keys/{key_id:uuid}")
    async def set_key_quotas(
        self,
        call: CallDep,
        tenant_id: uuid.UUID,
        key_id: uuid.UUID,
        data: Limits,
    ) -> Limits:
        """Replace one key's overrides (null fields: the tenant's limit applies)."""
        return await services.set_limits(await call.session(), call.actor, tenant_id, data, key_id)
