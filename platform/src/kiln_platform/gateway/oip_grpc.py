"""OIP over gRPC beside `/v2`: ``inference.GRPCInferenceService`` (KServe's predict v2, what
``tritonclient.grpc`` calls, KServe's gRPC client too) on ``KILN_GRPC_PORT``, in the gateway's
process and event loop.

Each call is its REST route's: the same bearer key (``authorization`` metadata), admission
(quotas; for ``ModelInfer`` the class from ``x-kiln-priority`` and the deadline from the call's
gRPC deadline, else ``x-kiln-timeout``), ledger and workers (``oip_services``); its errors are
gRPC status codes with the REST message. ``ServerLive`` and ``ServerReady`` need no key, as
``/v2/health/*``. Triton's ``ModelConfig``, ``RepositoryIndex`` and ``ModelStatistics`` are
REST's ``…/config``, ``/v2/repository/index`` and ``…/stats``. Every call's trailing metadata
carries its ``x-request-id`` and the quotas' rate-limit headers. An LLM takes ``ModelInfer`` as
Triton's LLM backends do (``oip_llm``); ``ModelStreamInfer`` streams (``oip_grpc_stream``).
"""

from __future__ import annotations

import asyncio
import functools
import time
from typing import TYPE_CHECKING, Any
from uuid import UUID

import grpc
import structlog

from kiln_platform.admission.deps import priority_of, timeout_of
from kiln_platform.errors import KilnError
from kiln_platform.gateway import metrics, oip_models, oip_stats
from kiln_platform.gateway import oip_grpc_stream as streamed
from kiln_platform.gateway import oip_services as oip
from kiln_platform.gateway.auth import inference_principal
from kiln_platform.gateway.grpc_spans import traced
from kiln_platform.gateway.oip_grpc_codec import (
    SERVICE,
    code_of,
    config_of,
    index_of,
    message,
    metadata_of,
    request_of,
    response_of,
    stats_of,
)
from kiln_platform.observability import REQUEST_ID_HEADER, new_request_id

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from kiln_platform.admission.services import Admission
    from kiln_platform.context import Kiln

    Work = Callable[[Admission, Any], Awaitable[Any]]

log = structlog.get_logger(__name__)
S = grpc.StatusCode


class _Service:
    """The service's handlers on one ``Kiln``."""

    def __init__(self, kiln: Kiln) -> None:
        self.kiln = kiln

    async def server_live(self, _: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        return message("ServerLiveResponse")(live=True)

    async def server_ready(self, _: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        return message("ServerReadyResponse")(ready=await oip.server_ready(self.kiln))

    async def _server_metadata(self, admission: Admission, _: Any) -> Any:
        described = oip.server_metadata()
        return message("ServerMetadataResponse")(
            name=described.name, version=described.version, extensions=described.extensions
        )

    async def _model_ready(self, admission: Admission, call: Any) -> Any:
        version = await self._resolve(admission, call.name, call.version)
        return message("ModelReadyResponse")(ready=oip.model_ready(self.kiln, version))

    async def _model_metadata(self, admission: Admission, call: Any) -> Any:
        version = await self._resolve(admission, call.name, call.version)
        return metadata_of(oip_models.metadata(version))

    async def _model_config(self, admission: Admission, call: Any) -> Any:
        version = await self._resolve(admission, call.name, call.version)
        return config_of(oip_models.config(version, self.kiln.settings))

    async def _repository_index(self, admission: Admission, call: Any) -> Any:
        tenant = admission.terms.tenant
        return index_of(await oip.repository_index(self.kiln, tenant, call.ready))

    async def _model_statistics(self, admission: Admission, call: Any) -> Any:
        tenant = admission.terms.tenant
        if call.name:
            versions = [await self._resolve(admission, call.name, call.version)]
        else:
            versions = await oip.served_models(self.kiln, tenant)
        only = bool(call.name and call.version)
        stats = await oip_stats.model_stats(self.kiln, UUID(tenant), versions, only=only)
        return stats_of(stats)

    async def _model_infer(self, admission: Admission, call: Any) -> Any:
        version = await self._resolve(admission, call.model_name, call.model_version)
        split = not call.model_version and self.kiln.resolver.split(
            call.model_name, admission.terms.tenant
        )
        admission.serves(version.model, split=split)
        request, tensors = request_of(call)
        address = (call.model_name, call.model_version or None)
        result, served = await oip_models.run(
            self.kiln, admission, version, request, tensors, address=address
        )
        return response_of(request, result, served.model, served.version)

    async def _resolve(self, admission: Admission, name: str, version: str) -> Any:
        tenant = admission.terms.tenant
        return await oip.resolve(self.kiln, name, version or None, tenant)

    def admitted(self, method: str, work: Work, *, scheduled: bool = False) -> Any:
        """The handler of an authenticated call: ``work`` inside its admission."""

        async def handler(call: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            headers = {k: v for k, v in context.invocation_metadata() or () if isinstance(v, str)}
            request_id, started = new_request_id(), time.perf_counter()
            trailing: list[tuple[str, str]] = [(REQUEST_ID_HEADER, request_id)]
            code = S.OK
            structlog.contextvars.bind_contextvars(request_id=request_id)
            with traced(method, headers, request_id, trailing) as span:
                try:
                    async with self.kiln.admissions.open({"request_id": request_id}) as admission:
                        try:
                            answer = await self._answer(admission, call, context, headers,
                                                        work=work, scheduled=scheduled)  # fmt: skip
                        except KilnError as exc:
                            admission.response_status = exc.status_code
                            code = code_of(exc.status_code)
                            log.warning("grpc call failed", method=method, code=code.name,
                                        error=exc.message)  # fmt: skip
                            trailing += _rate_headers(admission)
                            await context.abort(code, exc.message, tuple(trailing))
                        trailing += _rate_headers(admission)
                    context.set_trailing_metadata(tuple(trailing))
                    return answer
                except asyncio.CancelledError:  # the client went away, or its deadline passed
                    code = S.CANCELLED
                    raise
                except Exception as exc:
                    if not isinstance(exc, grpc.aio.AbortError):
                        code = S.INTERNAL
                        log.exception("grpc call failed", method=method)
                        await context.abort(
                            code, "The server failed; please retry.", tuple(trailing)
                        )
                    raise
                finally:
                    if span is not None:
                        span.set_attribute("rpc.grpc.status_code", code.value[0])
                    metrics.GRPC_CALLS.labels(method, code.name).inc()
                    metrics.GRPC_SECONDS.labels(method).observe(time.perf_counter() - started)
                    structlog.contextvars.unbind_contextvars("request_id")

        return handler

    async def _answer(
        self, admission: Admission, call: Any, context: grpc.aio.ServicerContext[Any, Any],
        headers: dict[str, str], *, work: Work, scheduled: bool,
    ) -> Any:  # fmt: skip
        """Authenticate, enter the quotas (and for a call to a worker, set its class and
        deadline), do the work."""
        principal = await inference_principal(self.kiln, headers.get("authorization", ""))
        await admission.enter(principal)
        if scheduled:
            admission.schedule(priority_of(headers), self._timeout(context, headers))
        answer = await work(admission, call)
        admission.response_status = 200
        return answer

    def _timeout(
        self, context: grpc.aio.ServicerContext[Any, Any], headers: dict[str, str]
    ) -> float:
        """The call's gRPC deadline, else ``x-kiln-timeout`` (or the server's default)."""
        remaining = context.time_remaining()
        if remaining is not None:
            return max(float(remaining), 0.001)
        return timeout_of(headers, self.kiln.settings.request_timeout_s)


def _rate_headers(admission: Admission) -> list[tuple[str, str]]:
    return [(k.lower(), v) for k, v in admission.grant.headers.items()]


def _handlers(kiln: Kiln) -> grpc.GenericRpcHandler:
    service = _Service(kiln)
    calls: dict[str, Callable[..., Awaitable[Any]]] = {
        "ServerLive": service.server_live,
        "ServerReady": service.server_ready,
        "ServerMetadata": service.admitted("ServerMetadata", service._server_metadata),
        "ModelReady": service.admitted("ModelReady", service._model_ready),
        "ModelMetadata": service.admitted("ModelMetadata", service._model_metadata),
        "ModelInfer": service.admitted("ModelInfer", service._model_infer, scheduled=True),
        "ModelConfig": service.admitted("ModelConfig", service._model_config),
        "RepositoryIndex": service.admitted("RepositoryIndex", service._repository_index),
        "ModelStatistics": service.admitted("ModelStatistics", service._model_statistics),
    }
    handlers = {
        name: grpc.unary_unary_rpc_method_handler(
            handler,
            request_deserializer=message(f"{name}Request").FromString,
            response_serializer=lambda reply: reply.SerializeToString(),
        )
        for name, handler in calls.items()
    }
    handlers[streamed.METHOD] = grpc.stream_stream_rpc_method_handler(
        functools.partial(streamed.serve, kiln),
        request_deserializer=message("ModelInferRequest").FromString,
        response_serializer=lambda reply: reply.SerializeToString(),
    )
    return grpc.method_handlers_generic_handler(SERVICE, handlers)


async def serve(kiln: Kiln, port: int) -> grpc.aio.Server:
    """Start the service on ``port`` (all interfaces, as the REST server's host allows), its
    messages bounded by ``KILN_MAX_TENSOR_BODY_BYTES`` as `/v2` bodies are; a port in use is an
    error (no ``SO_REUSEPORT``: two gateways would share it unseen)."""
    limit = kiln.settings.max_tensor_body_bytes
    server = grpc.aio.server(options=[
        ("grpc.so_reuseport", 0),
        ("grpc.max_receive_message_length", limit),
        ("grpc.max_send_message_length", -1),
    ])  # fmt: skip
    server.add_generic_rpc_handlers((_handlers(kiln),))
    if server.add_insecure_port(f"{kiln.settings.host}:{port}") == 0:
        raise OSError(f"cannot listen for gRPC on port {port}")
    await server.start()
    log.info("grpc listening", port=port)
    return server
