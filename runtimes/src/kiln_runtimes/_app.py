"""The worker's HTTP surface (endpoints in ``protocol``); errors become ``ErrorReply`` here only."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import TypeVar

import msgspec
import structlog
from aiohttp import web
from aiohttp.typedefs import Middleware
from prometheus_client import CONTENT_TYPE_LATEST

from kiln_runtimes import _embed, _generate, _tensor, tracing
from kiln_runtimes._errors import BadRequest, Internal, Unauthorized, Unsupported, WorkerError
from kiln_runtimes._runtime import Worker
from kiln_runtimes.protocol import (
    CONTENT_TYPE,
    EmbedRequest,
    GenerateRequest,
    InferRequest,
    encoder,
)

T = TypeVar("T")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
WORKER = web.AppKey("worker", Worker)
OUTCOME = web.RequestKey("outcome", str)
COUNTED = frozenset({"/embed", "/generate", "/infer"})
PROBES = frozenset({"/livez", "/readyz"})
"""The kubelet's probes: the only routes that answer without the worker secret (no body)."""
TENSOR_BODY_LIMIT = 256 << 20
log = structlog.get_logger(__name__)


def create_app(worker: Worker) -> web.Application:
    """Build the aiohttp application serving one worker."""
    settings, manifest = worker.settings, worker.manifest
    # A msgpack int takes at most 9 bytes: room for a full queue of full-context inputs.
    body_limit = settings.max_queue * manifest.context_length * 9 + 65536
    if manifest.task == "tensor":
        body_limit = TENSOR_BODY_LIMIT
    app = web.Application(
        middlewares=[_errors, _gateway_only(settings.secret)], client_max_size=body_limit
    )
    app[WORKER] = worker
    app.router.add_get("/livez", _live)
    app.router.add_get("/readyz", _ready)
    app.router.add_get("/health", _health)
    app.router.add_get("/metrics", _metrics)
    if manifest.task == "embeddings":
        app.router.add_post("/embed", _embed_handler)
    if manifest.task == "generate":
        app.router.add_post("/generate", _generate_handler)
    if manifest.task == "tensor":
        app.router.add_post("/infer", _infer_handler)
    return app


def metrics_app(worker: Worker) -> web.Application:
    """``GET /metrics`` alone, without the secret, for ``--metrics-port`` (a port that only the
    monitoring namespace reaches; the worker's series carry no tenant label)."""
    app = web.Application()
    app[WORKER] = worker
    app.router.add_get("/metrics", _metrics)
    return app


def _gateway_only(secret: str) -> Middleware:
    """Refuse (401) every call but the probes unless it carries ``Bearer <secret>``, compared
    in constant time, before its body is read. An empty secret refuses them all."""
    expected = f"Bearer {secret}".encode()

    @web.middleware
    async def gateway_only(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path not in PROBES:
            given = request.headers.get("Authorization", "").encode("utf-8", "replace")
            if not secret or not hmac.compare_digest(given, expected):
                raise Unauthorized("this worker answers only its gateway")
        return await handler(request)

    return gateway_only


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Map ``WorkerError`` (and anything unexpected) to an ``ErrorReply``; count outcomes."""
    structlog.contextvars.clear_contextvars()
    try:
        response = await handler(request)
    except web.HTTPException:
        raise
    except WorkerError as error:
        log.warning("request refused", code=error.code, reason=str(error))
        request[OUTCOME], response = error.code, _reply(error.reply(), error.status)
    except Exception:
        log.exception("request failed")
        request[OUTCOME], response = "internal", _reply(Internal("internal error").reply(), 500)
    if request.path in COUNTED:
        outcome = request.get(OUTCOME, "ok")
        request.app[WORKER].metrics.requests.labels(request.path, outcome).inc()
    return response


async def _live(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def _ready(request: web.Request) -> web.Response:
    return web.Response(status=200 if request.app[WORKER].info().ready else 503)


async def _health(request: web.Request) -> web.Response:
    info = request.app[WORKER].info()
    return _reply(info, 200 if info.ready else 503)


async def _metrics(request: web.Request) -> web.Response:
    body = request.app[WORKER].metrics.render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _embed_handler(request: web.Request) -> web.Response:
    worker = request.app[WORKER]
    embed_request = _decode(await request.read(), EmbedRequest)
    structlog.contextvars.bind_contextvars(request_id=embed_request.request_id)
    with tracing.continued("worker /embed", embed_request.traceparent), worker.admit():
        _embed.validate(embed_request, worker.manifest.context_length, worker.settings.max_queue)
        result = await _embed.embed(worker.batcher, embed_request)
    worker.metrics.queue_wait.observe(result.queue_ms / 1000)
    log.debug(
        "embedded",
        inputs=len(embed_request.input_ids),
        queue_ms=round(result.queue_ms, 3),
        compute_ms=round(result.compute_ms, 3),
    )
    return _reply(result, 200)


async def _generate_handler(request: web.Request) -> web.StreamResponse:
    worker = request.app[WORKER]
    generate_request = _decode(await request.read(), GenerateRequest)
    structlog.contextvars.bind_contextvars(request_id=generate_request.request_id)
    with tracing.continued("worker /generate", generate_request.traceparent), worker.admit():
        _generate.validate(generate_request, worker.manifest.context_length)
        response, request[OUTCOME] = await _generate.stream(
            request, worker.generator, generate_request, worker.settings.max_queue
        )
    log.debug("generated", outcome=request[OUTCOME])
    return response


async def _infer_handler(request: web.Request) -> web.Response:
    worker = request.app[WORKER]
    infer_request = _decode(await request.read(), InferRequest)
    structlog.contextvars.bind_contextvars(request_id=infer_request.request_id)
    with tracing.continued("worker /infer", infer_request.traceparent), worker.admit():
        result = await _tensor.infer(
            worker.batcher, infer_request, worker.manifest, worker.settings.max_queue
        )
    worker.metrics.queue_wait.observe(result.queue_ms / 1000)
    return _reply(result, 200)


def _decode(body: bytes, kind: type[T]) -> T:
    try:
        return msgspec.msgpack.decode(body, type=kind)
    except msgspec.ValidationError as exc:
        if str(exc).startswith("Object contains unknown field"):
            raise Unsupported(
                f"This worker is older than the gateway: {kind.__name__}: {exc}"
            ) from None
        raise BadRequest(f"cannot decode {kind.__name__}: {exc}") from None
    except msgspec.DecodeError as exc:
        raise BadRequest(f"cannot decode {kind.__name__}: {exc}") from None


def _reply(message: msgspec.Struct, status: int) -> web.Response:
    body = encoder.encode(message)
    return web.Response(body=body, status=status, headers={"Content-Type": CONTENT_TYPE})
