"""`/v2` HTTP handlers (Open Inference Protocol, REST): thin, behaviour in ``oip_services``."""

from __future__ import annotations

from typing import Any

from litestar import MediaType, Request, Response, get, post
from litestar.di import Provide
from litestar.params import SkipValidation
from litestar.response import Stream

from kiln_platform.admission.deps import provide_admission, provide_scheduled
from kiln_platform.admission.services import Admission
from kiln_platform.context import Kiln
from kiln_platform.gateway import completions, generate, oip_models, oip_stats
from kiln_platform.gateway import oip_services as oip
from kiln_platform.gateway.auth import authenticated, provide_principal
from kiln_platform.gateway.completions import SSE
from kiln_platform.gateway.oip_codec import HEADER_LENGTH
from kiln_platform.gateway.oip_schemas import (
    IndexedModel,
    ModelConfig,
    ModelMetadata,
    ModelStats,
    ServerMetadata,
)
from kiln_platform.openapi import OIP_ERRORS, DocumentedController
from kiln_platform.registry import lifecycle

KilnDep = SkipValidation[Kiln]
AdmissionDep = SkipValidation[Admission]
AUTH = {"principal": Provide(provide_principal), "admission": Provide(provide_admission)}
SCHEDULED = {**AUTH, "admission": Provide(provide_scheduled)}
GUARDS = [authenticated]


def _status(ok: bool, what: str, headers: dict[str, str] | None = None) -> Response[Any]:
    if ok:
        return Response(b"", status_code=200, media_type=MediaType.TEXT, headers=headers)
    return Response({"error": f"{what} is not ready"}, status_code=503, media_type=MediaType.JSON,
                    headers=headers)  # fmt: skip


class OIPController(DocumentedController):
    """The Open Inference Protocol v2 REST API (what ``tritonclient.http`` speaks)."""

    errors = OIP_ERRORS

    path = "/v2"

    @get("/health/live", media_type=MediaType.TEXT)
    async def live(self) -> Response[Any]:
        """The server is alive (200, no body)."""
        return Response(b"", status_code=200, media_type=MediaType.TEXT)

    @get("/health/ready", media_type=MediaType.TEXT)
    async def ready(self, kiln: KilnDep) -> Response[Any]:
        """The server is ready (database reachable and migrated)."""
        return _status(await oip.server_ready(kiln), "the server")

    @get("/", dependencies=AUTH, guards=GUARDS)
    async def server_metadata(self, admission: AdmissionDep) -> ServerMetadata:
        """Server name, version and extensions."""
        return oip.server_metadata()

    @get(
        ["/models/{name:str}", "/models/{name:str}/versions/{version:str}"],
        dependencies=AUTH,
        guards=GUARDS,
    )
    async def model_metadata(
        self, kiln: KilnDep, admission: AdmissionDep, name: str, version: str | None = None
    ) -> Response[ModelMetadata]:
        """A model's inputs and outputs (``-1`` marks a dynamic dimension); an LLM's, as
        Triton's vLLM backend's (``oip_llm``)."""
        tenant = str(admission.principal.tenant_id)
        resolved = await oip.resolve(kiln, name, version, tenant)
        return Response(oip_models.metadata(resolved), headers=lifecycle.headers(resolved))

    @get(
        ["/models/{name:str}/config", "/models/{name:str}/versions/{version:str}/config"],
        dependencies=AUTH,
        guards=GUARDS,
    )
    async def model_config(
        self, kiln: KilnDep, admission: AdmissionDep, name: str, version: str | None = None
    ) -> Response[ModelConfig]:
        """A model's configuration in Triton's shape (the model configuration extension); an
        LLM's as Triton's vLLM backend's (decoupled)."""
        tenant = str(admission.principal.tenant_id)
        resolved = await oip.resolve(kiln, name, version, tenant)
        config = oip_models.config(resolved, kiln.settings)
        return Response(config, headers=lifecycle.headers(resolved))

    @get(
        [
            "/models/stats",
            "/models/{name:str}/stats",
            "/models/{name:str}/versions/{version:str}/stats",
        ],
        dependencies=AUTH,
        guards=GUARDS,
    )
    async def model_stats(
        self,
        kiln: KilnDep,
        admission: AdmissionDep,
        name: str | None = None,
        version: str | None = None,
    ) -> ModelStats:
        """Triton's statistics extension, for this key's tenant alone: its own requests today
        (UTC) per version, from its ledger rows; every tensor model it may call without a name."""
        tenant = admission.principal.tenant_id
        if name is None:
            versions = await oip.served_models(kiln, str(tenant))
        else:
            versions = [await oip.resolve(kiln, name, version, str(tenant))]
        return await oip_stats.model_stats(kiln, tenant, versions, only=version is not None)

    @get(
        ["/models/{name:str}/ready", "/models/{name:str}/versions/{version:str}/ready"],
        dependencies=AUTH,
        guards=GUARDS,
        media_type=MediaType.TEXT,
    )
    async def model_ready(
        self, kiln: KilnDep, admission: AdmissionDep, name: str, version: str | None = None
    ) -> Response[Any]:
        """200 when a worker of the version that serves this tenant is ready."""
        tenant = str(admission.principal.tenant_id)
        resolved = await oip.resolve(kiln, name, version, tenant)
        ready = oip.model_ready(kiln, resolved)
        return _status(ready, f"the model `{name}`", lifecycle.headers(resolved))

    @post("/repository/index", dependencies=AUTH, guards=GUARDS, status_code=200)
    async def repository_index(
        self, request: Request[Any, Any, Any], kiln: KilnDep, admission: AdmissionDep
    ) -> list[IndexedModel]:
        """The tensor models and LLMs this key's tenant may call, ``READY`` or ``UNAVAILABLE``
        (scaled to zero: a request starts a worker); ``{"ready": true}`` lists the ready ones
        only."""
        asked = oip.index_request(await request.body())
        return await oip.repository_index(kiln, str(admission.principal.tenant_id), asked.ready)

    @post(
        ["/models/{name:str}/generate", "/models/{name:str}/versions/{version:str}/generate"],
        dependencies=SCHEDULED, guards=GUARDS, status_code=200,
    )  # fmt: skip
    async def generate(
        self, kiln: KilnDep, admission: AdmissionDep, data: Any, name: str,
        version: str | None = None,
    ) -> Response[Any]:  # fmt: skip
        """Triton's generate extension on an LLM: ``text_input`` in, ``text_output`` out."""
        gen = await generate.prepare(kiln, admission, name, version, data, stream=False)
        answer = await generate.complete(gen)
        return Response(answer, media_type=MediaType.JSON, headers=lifecycle.headers(gen.version))

    @post(
        [
            "/models/{name:str}/generate_stream",
            "/models/{name:str}/versions/{version:str}/generate_stream",
        ],
        dependencies=SCHEDULED, guards=GUARDS, status_code=200, media_type=SSE,
    )  # fmt: skip
    async def generate_stream(
        self, kiln: KilnDep, admission: AdmissionDep, data: Any, name: str,
        version: str | None = None,
    ) -> Stream:  # fmt: skip
        """Triton's generate extension, streamed: an event per piece of ``text_output``."""
        gen = await generate.prepare(kiln, admission, name, version, data, stream=True)
        return completions.streamed(gen, generate.stream(gen))

    @post(
        ["/models/{name:str}/infer", "/models/{name:str}/versions/{version:str}/infer"],
        dependencies=SCHEDULED,
        guards=GUARDS,
    )
    async def infer(
        self,
        request: Request[Any, Any, Any],
        *,
        kiln: KilnDep,
        admission: AdmissionDep,
        name: str,
        version: str | None = None,
    ) -> Response[bytes]:
        """Run inference: JSON tensors, or the binary tensor data extension; an LLM's text in
        and out (``oip_llm``)."""
        tenant = str(admission.principal.tenant_id)
        resolved = await oip.resolve(kiln, name, version, tenant)
        admission.serves(
            resolved.model, split=version is None and kiln.resolver.split(name, tenant)
        )
        body, length = await request.body(), request.headers.get(HEADER_LENGTH)
        body, headers = await oip_models.infer(
            kiln, admission, resolved, body, address=(name, version), header_length=length
        )
        media_type = headers.pop("content-type")
        headers.update(lifecycle.headers(resolved))
        return Response(body, status_code=200, headers=headers, media_type=media_type)
