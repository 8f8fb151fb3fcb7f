"""The models page: each model's versions (state, lifecycle, aliases, engine settings, accuracy
report, pool replicas and latency, the live part polled), its route, its canary rollout (step
and decision history) and its shadow's comparison (both platform-admins only), and its imports;
platform-admins change a route (canary, promotion, rollback), a version's engine settings and
pool bounds, and import a model (upload, then its build job's phases until ready) through the
same services as the admin API."""

from __future__ import annotations

import tempfile
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from litestar import Controller, get, post
from litestar.datastructures import UploadFile
from litestar.response import Template

from kiln_console import forms, model_rows
from kiln_console.auth import AnyRequest, KilnDep, Viewer, ViewerDep
from kiln_platform.admin.deps import transaction
from kiln_platform.compiler import services as jobs
from kiln_platform.context import Kiln
from kiln_platform.errors import BadRequest, NotFound
from kiln_platform.gateway import latency
from kiln_platform.registry import imports, intake, rollouts, services, versions
from kiln_platform.registry.engine import EngineSettings, EngineUpdate
from kiln_platform.registry.schemas import RouteUpdate
from kiln_platform.registry.services import ModelRoutes
from kiln_platform.registry.upload import upload_dir
from kiln_platform.shadow import services as shadows

if TYPE_CHECKING:
    from litestar.datastructures import FormMultiDict
    from sqlalchemy.ext.asyncio import AsyncSession

CHUNK = 1 << 20


class Models(Controller):
    """``/console/models`` and an import's job panel ``/console/compile-jobs/{id}``."""

    opt = {"resource": "models"}  # noqa: RUF012 (auth.authorize reads it)

    @get("/models")
    async def page(self, kiln: KilnDep, viewer: ViewerDep) -> Template:
        """Models, versions, accuracy reports, routes and pool sizes; the import form."""
        async with transaction(kiln, viewer.actor) as session:
            context = await _context(session, kiln, viewer)
        return Template("models.html.j2", context=context)

    @post("/models/{name:str}/route")
    async def route(
        self, request: AnyRequest, kiln: KilnDep, viewer: ViewerDep, name: str
    ) -> Template:
        """Set a route from the form; the table comes back with it applied."""
        form = await request.form()
        fields = {
            "stable_version": str(form.get("stable_version", "")),
            "canary_version": str(form.get("canary_version") or "") or None,
            "canary_percent": forms.percent(str(form.get("canary_percent", "")), "canary_percent"),
        }
        data = forms.convert(fields, RouteUpdate)
        async with transaction(kiln, viewer.actor) as session:
            await services.set_route(
                session, viewer.actor, name, data, reconcile=kiln.pools.reconcile
            )
            context = await _context(session, kiln, viewer)
        # committed, and the pools reconciled: the sizes shown are the new route's
        return Template("_models.html.j2", context={**context, "partial": True})

    @get("/models/{name:str}/pools")
    async def pools(self, kiln: KilnDep, viewer: ViewerDep, name: str) -> Template:
        """One model's live table (the page polls it): states, replicas, latency."""
        async with transaction(kiln, viewer.actor) as session:
            context = await _context(session, kiln, viewer, only=name)
        return Template("_pools.html.j2", context={**context, "card": context["cards"][0]})

    @post("/models/{name:str}/versions/{version:str}/engine")
    async def engine(
        self, request: AnyRequest, kiln: KilnDep, viewer: ViewerDep, name: str, version: str
    ) -> Template:
        """Set a version's engine settings and pool bounds (blank: the deployment's default);
        the pool resizes, or its workers restart for a worker setting."""
        form = await request.form()
        fields = {f: _whole(str(form.get(f, "")), f) for f in ENGINE_FIELDS if f in form}
        data = forms.convert(fields, EngineUpdate)
        async with transaction(kiln, viewer.actor) as session:
            await versions.update_engine(session, viewer.actor, name, version, data)
        await kiln.pools.reconcile()  # committed: this gateway's pool takes the new bounds now
        async with transaction(kiln, viewer.actor) as session:
            context = await _context(session, kiln, viewer)
        opened = f"{name}@{version}"  # the saved version's fold stays open
        return Template("_models.html.j2", context={**context, "partial": True, "opened": opened})

    @post("/models/import", request_max_body_size=None)
    async def import_model(self, request: AnyRequest, kiln: KilnDep, viewer: ViewerDep) -> Template:
        """Import an uploaded archive, .gguf or .onnx (``registry.imports.import_file``): a build
        job's panel (202, it polls until the job ends) or a tensor model's new version (201).
        The role is checked (``auth.authorize``) before the multipart body is read."""
        form = await request.form()
        scoring = EngineSettings(score_prompts=True if form.get("score_prompts") else None)
        options = imports.ImportOptions(
            task=_choice(form, "task"), precision=_choice(form, "precision"),
            target=_choice(form, "target"), version=_choice(form, "version"), engine=scoring,
        )  # fmt: skip
        upload = form.get("file")
        if not isinstance(upload, UploadFile):
            raise BadRequest("Choose a file.", param="file")
        with tempfile.TemporaryDirectory(dir=upload_dir(kiln.settings), prefix="body-") as tmp:
            body = Path(tmp) / "body"
            await _save(upload, body, kiln.settings.max_upload_bytes)
            done = await intake.import_file(
                kiln, viewer.actor, str(form.get("name", "")).strip(), body, options
            )
        if isinstance(done, uuid.UUID):
            return await _job_panel(kiln, viewer, done, status_code=202)
        async with transaction(kiln, viewer.actor) as session:
            context = await _context(session, kiln, viewer)
        uploaded = {"model": done.model, "version": done.version}
        return Template("_import_job.html.j2", status_code=201,
                        context={**context, "job": None, "uploaded": uploaded})  # fmt: skip

    @get("/compile-jobs/{job_id:uuid}", opt={"resource": "compile-jobs"})
    async def job(self, kiln: KilnDep, viewer: ViewerDep, job_id: uuid.UUID) -> Template:
        """An import's job panel: phase and percent while it runs (it polls itself every second),
        the version and its accuracy report when done, the file and field at fault if failed."""
        return await _job_panel(kiln, viewer, job_id)


async def _job_panel(
    kiln: Kiln, viewer: Viewer, job_id: uuid.UUID, *, status_code: int = 200
) -> Template:
    async with transaction(kiln, viewer.actor) as session:
        job = await jobs.view(session, viewer.actor, job_id)
        context: dict[str, Any] = {"viewer": viewer, "job": job, "uploaded": None}
        if job.status == "done":  # the table gains the version (swapped out of band)
            context.update(await _context(session, kiln, viewer))
    return Template("_import_job.html.j2", context=context, status_code=status_code)


ENGINE_FIELDS = ("min_replicas", "max_replicas", "max_batch_size", "max_context", "adapter_slots")


def _whole(value: str, param: str) -> int | None:
    """A whole number from a form field (blank: None, the deployment's default)."""
    text = value.strip()
    if not text:
        return None
    if not text.isdigit():
        raise BadRequest(f"'{param}' must be a whole number (or blank for the default).",
                         param=param)  # fmt: skip
    return int(text)


def _choice(form: FormMultiDict, field: str) -> str | None:
    """A form field, None when left empty or on "auto"."""
    value = str(form.get(field) or "").strip()
    return None if value in ("", "auto") else value


async def _save(upload: UploadFile, dest: Path, max_bytes: int) -> None:
    """Copy an uploaded file to ``dest``; ``BadRequest`` beyond ``max_bytes``."""
    size = 0
    with dest.open("wb") as f:
        while chunk := await upload.read(CHUNK):
            size += len(chunk)
            if size > max_bytes:
                raise BadRequest(f"the upload exceeds the {max_bytes}-byte limit", param="file")
            f.write(chunk)
    if size == 0:
        raise BadRequest("Choose a file.", param="file")


async def _context(
    session: AsyncSession, kiln: Kiln, viewer: Viewer, only: str | None = None
) -> dict[str, Any]:
    """Each model's card: route, versions, rows; the accuracy reports and engine settings
    (not for ``only``, the polled table, which needs neither)."""
    routes: list[ModelRoutes] = await services.list_routes(session, viewer.actor)
    if only is not None:
        routes = [r for r in routes if r[0].model == only] or _missing(only)
    builds = (
        await jobs.list_jobs(session, viewer.actor) if viewer.may_change("compile-jobs") else []
    )
    sizes, seen = kiln.pools.sizes(), latency.by_version(kiln.metrics.duration)
    cards = [
        (route, names, model_rows.rows(route, names, builds, sizes, seen))
        for route, names in routes
    ]
    context: dict[str, Any] = {"viewer": viewer, "models": routes, "cards": cards}
    if viewer.may_change("model-rollouts"):  # platform-admins alone read and start them
        context["rollouts"] = await rollouts.latest_rollouts(session, viewer.actor)
    if only is None:
        context["reports"] = await versions.accuracy_reports(session, viewer.actor)
        context["engines"] = await versions.engine_settings(session, viewer.actor)
        context["releases"] = await versions.releases(session, viewer.actor)
        if viewer.may_change(shadows.RESOURCE):  # a report spans every tenant's requests
            context["shadows"] = await shadows.views(session, viewer.actor, kiln.shadows.reports())
    return context


def _missing(name: str) -> list[ModelRoutes]:
    raise NotFound(f"No model `{name}`.")
