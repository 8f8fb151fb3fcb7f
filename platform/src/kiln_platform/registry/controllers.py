"""`/admin/v1` model and compile-job handlers: thin, behaviour in the services."""

from __future__ import annotations

import tempfile
import uuid
from pathlib import Path
from typing import Any

import msgspec
from litestar import Request, get, post
from litestar.di import Provide
from litestar.params import SkipValidation

from kiln_platform.admin.problems import DocumentedController
from kiln_platform.compiler import services as jobs
from kiln_platform.compiler.schemas import CompileJobView, CompileRequest, UploadView
from kiln_platform.context import Kiln
from kiln_platform.gateway.auth import provide_admin_reader, provide_admin_writer
from kiln_platform.keys.services import Principal
from kiln_platform.registry.upload import receive, upload_dir, upload_version

KilnDep = SkipValidation[Kiln]
PrincipalDep = SkipValidation[Principal]
WRITE = {"principal": Provide(provide_admin_writer)}
READ = {"principal": Provide(provide_admin_reader)}


class AdminModelsController(DocumentedController):
    """Model upload and compilation for platform operators."""

    path = "/admin/v1"

    @post(
        "/models/{name:str}/versions",
        dependencies=WRITE,
        status_code=201,
        request_max_body_size=None,  # the upload limit is enforced while streaming
    )
    async def upload(
        self,
        request: Request[Any, Any, Any],
        kiln: KilnDep,
        principal: PrincipalDep,
        name: str,
        version: str | None = None,
    ) -> UploadView:
        """Upload an ONNX model (a .onnx file, or a .zip/.tar folder with external data)."""
        settings = kiln.settings
        with tempfile.TemporaryDirectory(dir=upload_dir(settings), prefix="body-") as tmp:
            path = Path(tmp) / "body"
            await receive(request.stream(), path, settings.max_upload_bytes)
            done = await upload_version(
                kiln.db.sessions, kiln.store, settings, name, path, version=version
            )
        await kiln.resolver.refresh()
        return UploadView(
            model=done.model,
            version=done.version,
            artifact_digest=done.artifact_digest,
            inputs=msgspec.to_builtins(done.manifest.inputs),
            outputs=msgspec.to_builtins(done.manifest.outputs),
            batching=done.manifest.batching,
        )

    @post("/models/{name:str}/versions/{version:str}/compile", dependencies=WRITE, status_code=202)
    async def compile(
        self, kiln: KilnDep, principal: PrincipalDep, name: str, version: str, data: CompileRequest
    ) -> CompileJobView:
        """Queue a compile of a version for a target (the same compile is never queued twice)."""
        async with kiln.db.sessions.begin() as session:
            job = await jobs.enqueue(session, name, version, data.target, data.precision)
            job_id = job.id
        kiln.compiler.poke()
        async with kiln.db.sessions() as session:
            return await jobs.view(session, job_id)

    @get("/compile-jobs/{job_id:uuid}", dependencies=READ)
    async def get_job(
        self, kiln: KilnDep, principal: PrincipalDep, job_id: uuid.UUID
    ) -> CompileJobView:
        """One compile job: queued, running, done (with its report) or failed (with the reason)."""
        async with kiln.db.sessions() as session:
            return await jobs.view(session, job_id)

    @get("/compile-jobs", dependencies=READ)
    async def list_jobs(self, kiln: KilnDep, principal: PrincipalDep) -> list[CompileJobView]:
        """The newest compile jobs."""
        async with kiln.db.sessions() as session:
            return await jobs.list_jobs(session)
