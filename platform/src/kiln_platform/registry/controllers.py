"""`/admin/v1` model, route and compile-job handlers: thin, behaviour in the services.

Every one is platform-admin only (``admin.authz``: ``models`` and ``compile-jobs``); an upload
is authorized (``admin.deps.authorize``) before its body is read.
"""

from __future__ import annotations

import tempfile
import uuid
from pathlib import Path
from typing import Any

import msgspec
from litestar import Request, Response, delete, get, patch, post, put
from litestar.openapi.datastructures import ResponseSpec

from kiln_platform.admin.deps import AdminController, CallDep
from kiln_platform.compiler import services as jobs
from kiln_platform.compiler.schemas import CompileJobView, CompileRequest, UploadView
from kiln_platform.errors import BadRequest
from kiln_platform.registry import aliases, imports, intake, pins, rollouts, services, versions
from kiln_platform.registry.engine import EngineSettings
from kiln_platform.registry.schemas import (
    AliasUpdate,
    AliasView,
    PinUpdate,
    PinView,
    RolloutStart,
    RolloutView,
    RouteUpdate,
    RouteView,
)
from kiln_platform.registry.upload import check_names, receive, upload_dir

COMPILE_JOBS = {"resource": "compile-jobs"}
MODEL_PINS = {"resource": "model-pins"}
MODEL_ROLLOUTS = {"resource": "model-rollouts"}


class AdminModelsController(AdminController):
    """Model upload and compilation for platform operators."""

    opt = {"resource": "models"}  # noqa: RUF012 (admin.deps.authorize reads it)

    @post(
        "/models/{name:str}/versions",
        status_code=201,
        request_max_body_size=None,  # the upload limit is enforced while streaming
        responses={202: ResponseSpec(CompileJobView, description="A build job was queued.")},
    )
    async def upload(
        self,
        *,
        request: Request[Any, Any, Any],
        call: CallDep,
        name: str,
        version: str | None = None,
        task: str | None = None,
        precision: str | None = None,
        target: str | None = None,
        max_batch_size: int | None = None,
        max_context: int | None = None,
        adapter_slots: int | None = None,
        score_prompts: bool | None = None,
    ) -> Response[UploadView | CompileJobView]:
        """Upload a model. An ONNX tensor model (.onnx, or a .zip/.tar folder with external
        data) is registered at once (201). A Hugging Face or GenAI folder (.zip/.tar) or a .gguf
        file is stored as the version's source and built by a job (202, the job: follow it at
        ``/compile-jobs/{id}``). ``score_prompts``: a generation build keeps every position's
        logits, so requests may score their prompt (``echo`` with ``logprobs``)."""
        settings = call.kiln.settings
        version = version or None  # a blank ``version=`` (a form's empty field): the next number
        check_names(name, version)  # before the body is read
        try:
            engine = msgspec.convert(
                {"max_batch_size": max_batch_size, "max_context": max_context,
                 "adapter_slots": adapter_slots, "score_prompts": score_prompts}, EngineSettings,
            )  # fmt: skip
        except msgspec.ValidationError as exc:
            raise BadRequest(str(exc)) from None
        options = imports.ImportOptions(task, precision, target, version, engine)
        with tempfile.TemporaryDirectory(dir=upload_dir(settings), prefix="body-") as tmp:
            path = Path(tmp) / "body"
            await receive(request.stream(), path, settings.max_upload_bytes)
            done = await intake.import_file(call.kiln, call.actor, name, path, options)
        if isinstance(done, uuid.UUID):
            async with call.kiln.db.sessions() as session:
                job = await jobs.view(session, call.actor, done)
            return Response(job, status_code=202)
        return Response(
            UploadView(
                model=done.model,
                version=done.version,
                artifact_digest=done.artifact_digest,
                inputs=msgspec.to_builtins(done.manifest.inputs),
                outputs=msgspec.to_builtins(done.manifest.outputs),
                batching=done.manifest.batching,
            ),
            status_code=201,
        )

    @get("/models/{name:str}/versions/{version:str}")
    async def get_version(self, call: CallDep, name: str, version: str) -> versions.VersionView:
        """One version: engine settings, the build's accuracy report, manifest."""
        async with call.kiln.db.sessions() as session:
            return await versions.view(session, call.actor, name, version)

    @patch("/models/{name:str}/versions/{version:str}")
    async def update_version(
        self, call: CallDep, name: str, version: str, data: versions.VersionUpdate
    ) -> versions.VersionView:
        """Change a version's engine settings (its workers restart with them), its lifecycle
        state (``sunset``, ``successor``) or its lineage."""
        async with call.kiln.db.sessions.begin() as session:
            view = await versions.update_version(session, call.actor, name, version, data)
        await call.kiln.pools.reconcile()
        return view

    @post(
        "/models/{name:str}/versions/{version:str}/compile",
        opt=COMPILE_JOBS,
        status_code=202,
    )
    async def compile(
        self, call: CallDep, name: str, version: str, data: CompileRequest
    ) -> CompileJobView:
        """Queue a compile of a version for a target (the same compile is never queued twice)."""
        async with call.kiln.db.sessions.begin() as session:
            job = await jobs.enqueue(
                session, call.actor, name, version, data.target, data.precision
            )
            job_id = job.id
        call.kiln.compiler.poke()
        async with call.kiln.db.sessions() as session:
            return await jobs.view(session, call.actor, job_id)

    @get("/compile-jobs/{job_id:uuid}", opt=COMPILE_JOBS)
    async def get_job(self, call: CallDep, job_id: uuid.UUID) -> CompileJobView:
        """One compile job: queued, running, done (with its report) or failed (with the reason)."""
        async with call.kiln.db.sessions() as session:
            return await jobs.view(session, call.actor, job_id)

    @get("/compile-jobs", opt=COMPILE_JOBS)
    async def list_jobs(self, call: CallDep) -> list[CompileJobView]:
        """The newest compile jobs."""
        async with call.kiln.db.sessions() as session:
            return await jobs.list_jobs(session, call.actor)


class RoutesController(AdminController):
    """Which versions of a model serve (canary, promotion, rollback)."""

    opt = {"resource": "models"}  # noqa: RUF012 (admin.deps.authorize reads it)

    @get("/models/{name:str}/route")
    async def get_route(self, call: CallDep, name: str) -> RouteView:
        """A model's route (without one, the newest version serves)."""
        return await services.get_route(await call.session(), call.actor, name)

    @put("/models/{name:str}/route")
    async def set_route(self, call: CallDep, name: str, data: RouteUpdate) -> RouteView:
        """Set the stable version and an optional canary share (platform-admin); this gateway
        applies it at once, others within their 2 s refresh."""
        return await services.set_route(
            await call.session(), call.actor, name, data, reconcile=call.kiln.pools.reconcile
        )

    @get("/models/{name:str}/aliases")
    async def list_aliases(self, call: CallDep, name: str) -> list[AliasView]:
        """A model's aliases (``model@alias`` on /v1 and /v2)."""
        return await aliases.list_aliases(await call.session(), call.actor, name)

    @put("/models/{name:str}/aliases/{alias:str}")
    async def set_alias(self, call: CallDep, name: str, alias: str, data: AliasUpdate) -> AliasView:
        """Point an alias at a version, created or moved atomically (audited)."""
        return await aliases.set_alias(
            await call.session(), call.actor, name, alias, data.version,
            reconcile=call.kiln.pools.reconcile,
        )  # fmt: skip

    @delete("/models/{name:str}/aliases/{alias:str}", status_code=204)
    async def delete_alias(self, call: CallDep, name: str, alias: str) -> None:
        """Remove an alias."""
        await aliases.delete_alias(
            await call.session(), call.actor, name, alias, reconcile=call.kiln.pools.reconcile
        )

    @get("/models/{name:str}/pins", opt=MODEL_PINS)
    async def list_pins(self, call: CallDep, name: str) -> list[PinView]:
        """The tenants an operator pinned to a version or alias of the model."""
        return await pins.list_pins(await call.session(), call.actor, name)

    @put("/models/{name:str}/pins/{tenant_id:uuid}", opt=MODEL_PINS)
    async def set_pin(
        self, call: CallDep, name: str, tenant_id: uuid.UUID, data: PinUpdate
    ) -> PinView:
        """Pin a tenant's plain ``model`` to a version or alias (audited)."""
        return await pins.set_pin(
            await call.session(), call.actor, name, tenant_id, data.target,
            reconcile=call.kiln.pools.reconcile,
        )  # fmt: skip

    @delete("/models/{name:str}/pins/{tenant_id:uuid}", opt=MODEL_PINS, status_code=204)
    async def delete_pin(self, call: CallDep, name: str, tenant_id: uuid.UUID) -> None:
        """Unpin a tenant: it follows the route again."""
        await pins.delete_pin(
            await call.session(), call.actor, name, tenant_id, reconcile=call.kiln.pools.reconcile
        )

    @get("/models/{name:str}/rollout", opt=MODEL_ROLLOUTS)
    async def get_rollout(self, call: CallDep, name: str) -> RolloutView:
        """The model's newest rollout: state, current step, plan, decision history."""
        return await rollouts.get_rollout(await call.session(), call.actor, name)

    @put("/models/{name:str}/rollout", opt=MODEL_ROLLOUTS)
    async def start_rollout(self, call: CallDep, name: str, data: RolloutStart) -> RolloutView:
        """Roll a canary out step by step, promoted or rolled back on the analysis (audited)."""
        return await rollouts.start_rollout(
            await call.session(), call.actor, name, data, reconcile=call.kiln.rollouts.reload
        )

    @delete("/models/{name:str}/rollout", opt=MODEL_ROLLOUTS, status_code=200)
    async def abort_rollout(self, call: CallDep, name: str) -> RolloutView:
        """Abort the running rollout: everyone back on the stable version (audited)."""
        return await rollouts.abort_rollout(
            await call.session(), call.actor, name, reconcile=call.kiln.rollouts.reload
        )
