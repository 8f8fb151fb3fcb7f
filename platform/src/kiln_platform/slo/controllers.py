"""`/admin/v1/slos`, `/admin/v1/alerts` and `/admin/v1/alert-receivers`: thin handlers,
behaviour in ``slo.services`` and ``slo.receivers``."""

from __future__ import annotations

import uuid
from typing import Literal

from litestar import delete, get, post

from kiln_platform.admin.deps import AdminController, CallDep
from kiln_platform.slo import receivers, services
from kiln_platform.slo.schemas import (
    AlertView,
    ReceiverCreate,
    ReceiverCreated,
    ReceiverView,
    SloCreate,
    SloStatus,
    SloView,
)


class SlosController(AdminController):
    """Service level objectives of models (platform-admin)."""

    opt = {"resource": "slos"}  # noqa: RUF012 (admin.deps.authorize reads it)

    @post("/slos")
    async def create_slo(self, call: CallDep, data: SloCreate) -> SloView:
        """Define an SLO: a model's availability and/or latency objective over a period."""
        return await services.create_slo(await call.session(), call.actor, data)

    @get("/slos")
    async def list_slos(self, call: CallDep) -> list[SloView]:
        """Every SLO."""
        return await services.list_slos(await call.session(), call.actor)

    @get("/slos/{slo:str}/status")
    async def slo_status(self, call: CallDep, slo: str) -> SloStatus:
        """Budget remaining over the period, burn rate per alert window, alerts firing."""
        bucket_s = call.kiln.settings.slo_bucket_s
        return await services.slo_status(await call.session(), call.actor, slo, bucket_s)

    @delete("/slos/{slo:str}")
    async def delete_slo(self, call: CallDep, slo: str) -> None:
        """Delete an SLO and its counts (its alerts stay)."""
        await services.delete_slo(await call.session(), call.actor, slo)


class AlertsController(AdminController):
    """Alerts Kiln raised (SLO burn rates), firing and resolved."""

    opt = {"resource": "alerts"}  # noqa: RUF012 (admin.deps.authorize reads it)

    @get("/alerts")
    async def list_alerts(
        self, call: CallDep, status: Literal["firing", "resolved"] | None = None
    ) -> list[AlertView]:
        """The latest alerts, newest first (``status``: only firing or only resolved ones)."""
        return await services.list_alerts(await call.session(), call.actor, status)


class AlertReceiversController(AdminController):
    """Webhooks every alert notification is delivered to (platform-admin, audited)."""

    opt = {"resource": "alert-receivers"}  # noqa: RUF012 (admin.deps.authorize reads it)

    @post("/alert-receivers")
    async def create_receiver(self, call: CallDep, data: ReceiverCreate) -> ReceiverCreated:
        """Add a receiver; its signing key is returned once and stored sealed."""
        seal = receivers.receiver_seal(call.hmac_key)
        return await receivers.create_receiver(await call.session(), call.actor, data, seal)

    @get("/alert-receivers")
    async def list_receivers(self, call: CallDep) -> list[ReceiverView]:
        """Every receiver (never its key)."""
        return await receivers.list_receivers(await call.session(), call.actor)

    @delete("/alert-receivers/{receiver_id:uuid}")
    async def delete_receiver(self, call: CallDep, receiver_id: uuid.UUID) -> None:
        """Delete a receiver; its pending deliveries go with it."""
        await receivers.delete_receiver(await call.session(), call.actor, receiver_id)
