"""`/admin/v1/slos` and `/admin/v1/alerts`: thin handlers, behaviour in ``slo.services``."""

from __future__ import annotations

from typing import Literal

from litestar import delete, get, post

from kiln_platform.admin.deps import AdminController, CallDep
from kiln_platform.slo import services
from kiln_platform.slo.schemas import AlertView, SloCreate, SloStatus, SloView


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
