"""The SLOs page (platform-admins: each SLO's budget left and burn rates, create, delete) and
the alerts page (firing and resolved, polled): thin handlers over ``slo.services``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from litestar import Controller, get, post
from litestar.response import Template

from kiln_console import forms
from kiln_console.auth import AnyRequest, KilnDep, Viewer, ViewerDep
from kiln_console.errors import is_htmx
from kiln_platform.admin.deps import transaction
from kiln_platform.slo import services
from kiln_platform.slo.schemas import SloCreate

if TYPE_CHECKING:
    from litestar.datastructures import FormMultiDict
    from sqlalchemy.ext.asyncio import AsyncSession

    from kiln_platform.context import Kiln

POLL_S = 5
FIELDS = ("name", "model", "plan", "availability", "latency", "latency_ms", "period_days")


def _fields(form: FormMultiDict) -> dict[str, Any]:
    """The create form as ``SloCreate``'s fields: objectives typed as percentages."""
    text = {k: str(form.get(k) or "").strip() for k in FIELDS}
    fields: dict[str, Any] = {"name": text["name"], "model": text["model"],
                              "plan": text["plan"] or None,
                              "availability": forms.fraction(text["availability"], "availability"),
                              "latency": forms.fraction(text["latency"], "latency")}  # fmt: skip
    for name in ("latency_ms", "period_days"):
        if text[name]:
            fields[name] = forms.number(text[name], name)
    return fields


class Slos(Controller):
    """``/console/slos`` and ``/console/alerts``."""

    opt = {"resource": "slos"}  # noqa: RUF012 (auth.authorize reads it)

    @get("/slos")
    async def page(self, kiln: KilnDep, viewer: ViewerDep) -> Template:
        """Every SLO with its budget left and burn rates; the form that defines one."""
        async with transaction(kiln, viewer.actor) as session:
            context = await _context(session, kiln, viewer)
        return Template("slos.html.j2", context=context)

    @post("/slos")
    async def create(self, request: AnyRequest, kiln: KilnDep, viewer: ViewerDep) -> Template:
        """Define an SLO from the form; the table comes back with it."""
        data = forms.convert(_fields(await request.form()), SloCreate)
        async with transaction(kiln, viewer.actor) as session:
            await services.create_slo(session, viewer.actor, data)
            context = {**await _context(session, kiln, viewer), "partial": True}
        return Template("_slos.html.j2", context=context, status_code=201)

    @post("/slos/{slo:str}/delete")
    async def delete(self, kiln: KilnDep, viewer: ViewerDep, slo: str) -> Template:
        """Delete an SLO and its counts (its alerts stay)."""
        async with transaction(kiln, viewer.actor) as session:
            await services.delete_slo(session, viewer.actor, slo)
            context = {**await _context(session, kiln, viewer), "partial": True}
        return Template("_slos.html.j2", context=context)

    @get("/alerts", opt={"resource": "alerts"})
    async def alerts(self, request: AnyRequest, kiln: KilnDep, viewer: ViewerDep) -> Template:
        """Firing alerts, then resolved ones; the table polls itself (htmx asks for it alone)."""
        async with transaction(kiln, viewer.actor) as session:
            rows = await services.list_alerts(session, viewer.actor, None)
        firing = [a for a in rows if a.status == "firing"]
        resolved = [a for a in rows if a.status != "firing"]
        context = {"viewer": viewer, "firing": firing, "resolved": resolved, "poll_s": POLL_S}
        return Template("_alerts.html.j2" if is_htmx(request) else "alerts.html.j2",
                        context=context)  # fmt: skip


async def _context(session: AsyncSession, kiln: Kiln, viewer: Viewer) -> dict[str, Any]:
    """The SLOs page's context, read in the caller's transaction (after its change, if any)."""
    statuses = await services.slo_statuses(session, viewer.actor, kiln.settings.slo_bucket_s)
    return {"viewer": viewer, "statuses": statuses}
