"""The platform's Litestar application: ``create_app(settings)`` is the only way to build it.

The console is not the platform's to import (it imports the platform): its composition
(``kiln_console.compose``) hands its router and templates in as ``route_handlers`` and
``template_config``."""

from __future__ import annotations

import gc
import os
import re
from contextlib import asynccontextmanager
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

import structlog
from litestar import Litestar, MediaType, Request, Response, get
from litestar.datastructures import State
from litestar.di import Provide
from litestar.exceptions import (
    HTTPException,
    MethodNotAllowedException,
    NotFoundException,
    ValidationException,
)
from litestar.middleware import DefineMiddleware
from litestar.openapi import OpenAPIConfig
from litestar.params import SkipValidation
from litestar.plugins.prometheus import PrometheusConfig

from kiln_platform.adapters.controllers import AdaptersController
from kiln_platform.admin.deps import BAD_TEXT_MESSAGE, bad_text
from kiln_platform.admission.gate import shed_middleware
from kiln_platform.admission.middleware import admission_middleware
from kiln_platform.audit.controllers import AuditController
from kiln_platform.batches.controllers import (
    BatchesController,
    FilesController,
    MessageBatchesController,
)
from kiln_platform.batches.runner import BatchRunner
from kiln_platform.billing.controllers import PriceBooksController
from kiln_platform.body_limit import VLLM_PATHS, BodyLimits, body_limit_middleware
from kiln_platform.client_limits import refusal_middleware
from kiln_platform.context import Kiln, running
from kiln_platform.db import migrate
from kiln_platform.db.outage import DB_UNREACHABLE, unreachable
from kiln_platform.errors import (
    DISK_FULL,
    BadRequest,
    InsufficientStorage,
    KilnError,
    QuotaExceeded,
    ServiceUnavailable,
    disk_full,
)
from kiln_platform.gateway import messages
from kiln_platform.gateway.anthropic_models import VERSION_HEADER
from kiln_platform.gateway.chat_routes import ChatCompletionsController
from kiln_platform.gateway.controllers import OpenAIController, VllmController
from kiln_platform.gateway.conversation_routes import ConversationsController
from kiln_platform.gateway.messages_routes import MessagesController
from kiln_platform.gateway.oip import OIPController
from kiln_platform.gateway.schemas import ErrorBody, ErrorResponse
from kiln_platform.idempotency.middleware import idempotency_middleware
from kiln_platform.keys.controllers import KeysController
from kiln_platform.oauth.admin import ClientsController
from kiln_platform.oauth.controllers import OAuthController
from kiln_platform.observability import (
    configure_logging,
    request_id_middleware,
    tracing_middleware,
)
from kiln_platform.quotas.controllers import QuotasController
from kiln_platform.registry.controllers import AdminModelsController, RoutesController
from kiln_platform.reports.controllers import ReportsController
from kiln_platform.scrape import metrics_route
from kiln_platform.settings import GRACEFUL_SHUTDOWN_S
from kiln_platform.shadow.controllers import ShadowController
from kiln_platform.slo.controllers import (
    AlertReceiversController,
    AlertsController,
    SlosController,
)
from kiln_platform.strict_body import StrictRequest
from kiln_platform.tenants.controllers import TenantsController
from kiln_platform.users.controllers import UsersController
from kiln_platform.webhooks.controllers import WebhooksController
from kiln_runtimes import tracing

log = structlog.get_logger("kiln.app")
OPENAI_SHAPED = ("/v1", *sorted(VLLM_PATHS))
"""Paths whose errors are OpenAI's error object (vLLM's other routes answer in it too)."""

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Sequence

    import grpc
    from litestar.template.config import TemplateConfig
    from litestar.types import ControllerRouterHandler, Middleware

    from kiln_platform.settings import Settings


async def _grpc(kiln: Kiln) -> grpc.aio.Server | None:
    """OIP's gRPC service, started on ``KILN_GRPC_PORT`` (unless 0)."""
    if not kiln.settings.grpc_port:
        return None
    from kiln_platform.gateway.oip_grpc import serve  # grpc and protobuf only when served

    return await serve(kiln, kiln.settings.grpc_port)


def _error_response(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    """Map every error to the body its API expects: OpenAI's for `/v1`, problem details else."""
    if bad_text(exc):  # raised in a handler that has its session from admin.deps
        exc = BadRequest(BAD_TEXT_MESSAGE)
    if disk_full(exc):  # before `unreachable`, which counts any OSError (docs/reliability.md)
        exc = InsufficientStorage(DISK_FULL)
    elif unreachable(exc):  # work that needs the database during an outage
        exc = ServiceUnavailable(DB_UNREACHABLE, retry_after=5.0)
    if isinstance(exc, KilnError):
        status, message, param, code, kind = (
            exc.status_code, exc.message, exc.param, exc.code, exc.type,
        )  # fmt: skip
        retry_after = exc.retry_after
    elif isinstance(exc, HTTPException):
        status, message, param, retry_after = exc.status_code, exc.detail, None, None
        code = kind = "invalid_request_error" if status < 500 else "server_error"
        if isinstance(exc, ValidationException) and exc.extra:
            message, param = _validation_message(exc)
        elif isinstance(exc, NotFoundException | MethodNotAllowedException) and (
            message == HTTPStatus(status).phrase  # the router's, no handler's own detail
        ):
            message = f"{message}: {request.method} {request.url.path}"
    else:
        log.exception("unhandled error", path=request.url.path)
        status, message, param, retry_after = 500, "Internal server error.", None, None
        code = kind = "server_error"
    headers = {"retry-after": str(max(1, round(retry_after)))} if retry_after else {}
    if isinstance(exc, QuotaExceeded):  # no retry helps before the next month (OpenAI SDKs)
        headers["x-should-retry"] = "false"
    path = request.url.path
    if path.startswith("/v1/models") and VERSION_HEADER in request.headers:
        path = "/v1/messages"  # the anthropic SDK's models calls: its error object
    return _shaped(path, status, message, param=param, code=code, kind=kind, headers=headers)


def _shaped(
    path: str, status: int, message: str, *, param: str | None, code: str, kind: str,
    headers: dict[str, str],
) -> Response[Any]:  # fmt: skip
    """The error in its API's shape: Anthropic's, OpenAI's, OIP's, or problem details."""
    if path.startswith("/v1/messages"):  # Anthropic's error object
        return Response(messages.error_body(status, message), status_code=status, headers=headers)
    if path.startswith(OPENAI_SHAPED):
        body: Any = ErrorResponse(
            error=ErrorBody(message=message, type=kind, param=param, code=code)
        )
        return Response(body, status_code=status, headers=headers)
    if path.startswith("/v2"):  # the Open Inference Protocol's error shape
        return Response({"error": message}, status_code=status, headers=headers)
    problem = {"type": "about:blank", "title": code, "status": status, "detail": message}
    if param:  # an extension member (RFC 9457): the request field at fault
        problem["param"] = param
    return Response(
        problem, status_code=status, headers=headers, media_type="application/problem+json"
    )


def _validation_message(exc: ValidationException) -> tuple[str, str | None]:
    """msgspec's message and the field it names (``$.input[0]``, "unknown field `n`", or one
    within an item: ``documents[0].title``)."""
    first = exc.extra[0] if isinstance(exc.extra, list) else exc.extra
    if not isinstance(first, dict):
        return str(exc.detail), None
    message = str(first.get("message", exc.detail))
    named = _FIELD_IN_MESSAGE.search(message)
    key = str(first.get("key") or "").removeprefix("$.")
    within = key if key not in ("", "data", "$") else None
    if named:
        param = f"{within}.{named.group(1)}" if within else named.group(1)
        return (f"{message} (field '{param}')" if within else message), param
    return (f"{message} (field '{within}')" if within else message), within


_FIELD_IN_MESSAGE = re.compile(r"field `([^`]+)`")


@get("/healthz", media_type=MediaType.TEXT, include_in_schema=False)
async def healthz() -> str:
    """Alive."""
    return "ok"


@get("/readyz", include_in_schema=False)
async def readyz(kiln: SkipValidation[Kiln]) -> Response[dict[str, Any]]:
    """Ready: database reachable and migrated; or degraded (200, ``"degraded": true``): the
    database unreachable but the outage within its bound (cached keys served, usage spooled)."""
    try:
        current = await migrate.is_current(kiln.db.engine)
    except Exception:  # any failure to reach the database means not ready
        current = False
    degraded = not current and kiln.ledger.degraded()
    body: dict[str, Any] = {"database": current, "degraded": degraded}
    if kiln.fleet is not None:  # many gateways: this one's part (leader or follower)
        body["fleet"] = kiln.fleet.details()
    return Response(body, status_code=200 if current or degraded else 503)


_CONTROLLERS = (
    OpenAIController, ChatCompletionsController, ConversationsController, VllmController,
    MessagesController, MessageBatchesController,
    FilesController, BatchesController, OIPController, AdminModelsController, RoutesController,
    TenantsController,
    KeysController, UsersController, ClientsController, AdaptersController, AuditController,
    QuotasController, PriceBooksController, ReportsController, SlosController, AlertsController,
    AlertReceiversController, ShadowController, WebhooksController,
    OAuthController,
)  # fmt: skip


def _provide_kiln(state: State) -> Kiln:
    kiln: Kiln = state.kiln
    return kiln


def _middleware(
    settings: Settings, prometheus: PrometheusConfig, *, traced: bool
) -> list[Middleware]:
    """The app's middleware, outermost first (the server span only when tracing is on)."""
    return [
        prometheus.middleware,
        DefineMiddleware(request_id_middleware),
        *([DefineMiddleware(tracing_middleware)] if traced else []),
        # a connection past its address's limit gets its 429 before any other work
        DefineMiddleware(refusal_middleware, errors=_error_response),
        # the first reader of every body: nothing after it reads past the route's limit
        DefineMiddleware(
            body_limit_middleware,
            limits=BodyLimits.from_settings(settings),
            errors=_error_response,
        ),
        # before anything else of a request runs: a pool's recent refusal, repeated cheaply
        DefineMiddleware(shed_middleware, errors=_error_response),
        DefineMiddleware(idempotency_middleware, errors=_error_response),
        DefineMiddleware(admission_middleware),
    ]


def create_app(
    settings: Settings,
    *,
    route_handlers: Sequence[ControllerRouterHandler] = (),
    template_config: TemplateConfig[Any] | None = None,
) -> Litestar:
    """Build the app, with more ``route_handlers`` mounted beside the platform's and the
    ``template_config`` they render with; services start in its lifespan."""
    configure_logging(settings.log_level, settings.log_format)
    # OTEL_* is the standard's own environment, read here once (a tracer already set up, a
    # test's in-memory one, is kept); off, the server-span middleware is not even installed.
    traced = tracing.enabled() or tracing.configure(os.environ, "kiln")

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        async with running(settings, BatchRunner(settings)) as kiln:
            app.state.kiln = kiln
            grpc = await _grpc(kiln)
            # Everything built so far lives as long as the process: move it out of the cyclic
            # collector's reach, or each full collection walks it (~80 ms of stalled requests).
            gc.freeze()
            try:
                yield
            finally:
                if grpc is not None:  # calls in flight finish, as uvicorn drains HTTP's
                    await grpc.stop(GRACEFUL_SHUTDOWN_S)
                tracing.flush()

    prometheus = PrometheusConfig(app_name="kiln", prefix="kiln", group_path=True)
    return Litestar(
        route_handlers=[
            *_CONTROLLERS,
            metrics_route(settings.metrics_token),
            *route_handlers,
            healthz,
            readyz,
        ],
        dependencies={"kiln": Provide(_provide_kiln, sync_to_thread=False)},
        lifespan=[lifespan],
        middleware=_middleware(settings, prometheus, traced=traced),
        exception_handlers={Exception: _error_response},
        request_max_body_size=None,  # body_limit_middleware enforces each route's limit
        request_class=StrictRequest,  # "max_tokens": "5" is a 400, not a 5
        template_config=template_config,
        openapi_config=OpenAPIConfig(title="Kiln", version="0.1.0", path="/docs"),
    )
