"""Structured logs with request and trace ids, the request-id and tracing middlewares, and
``Server-Timing``."""

from __future__ import annotations

import contextlib
import contextvars
import logging
import re
import sys
import time
import uuid
from typing import TYPE_CHECKING

import structlog

from kiln_platform.db.outage import quiet_outage_logs
from kiln_runtimes import tracing

if TYPE_CHECKING:
    from collections.abc import Callable

    from litestar.types import ASGIApp, Message, Receive, Scope, Send

REQUEST_ID_HEADER = "x-request-id"
CLIENT_REQUEST_ID_HEADER = "x-client-request-id"
SERVER_TIMING_HEADER = "server-timing"
TRACEPARENT_HEADER = "traceparent"
TRACED_PREFIXES = ("/v1/", "/v2/")
"""The API routes a server span is made for (not health checks, the console or the admin API)."""
_VALID_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")
_timings: contextvars.ContextVar[dict[str, float] | None] = contextvars.ContextVar(
    "kiln_timings", default=None
)

_started: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "kiln_request_started", default=None
)


_after: contextvars.ContextVar[list[Callable[[], None]] | None] = contextvars.ContextVar(
    "kiln_after_response", default=None
)


def after_response(callback: Callable[[], None]) -> None:
    """Call ``callback`` once the current request's response is sent (now, outside one)."""
    callbacks = _after.get()
    if callbacks is None:
        callback()
    else:
        callbacks.append(callback)


def request_started() -> float | None:
    """When the current request reached the gateway (``time.monotonic``), if in one."""
    return _started.get()


def timing(name: str, ms: float) -> None:
    """Report where the current request's time went, in its ``Server-Timing`` header
    (``queue``: the fair queue, ``worker-queue`` and ``compute``: the worker, ``express``)."""
    timings = _timings.get()
    if timings is not None:
        timings[name] = ms


def _server_timing(timings: dict[str, float], started: float) -> bytes:
    total = (time.perf_counter() - started) * 1000
    parts = [f"{name};dur={ms:.1f}" for name, ms in timings.items()]
    return ", ".join([*parts, f"total;dur={total:.1f}"]).encode()


def configure_logging(level: str, fmt: str = "json") -> None:
    """Route stdlib and structlog records through one JSON (or console) renderer on stderr."""
    renderer = (
        structlog.processors.JSONRenderer() if fmt == "json" else structlog.dev.ConsoleRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            quiet_outage_logs,
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
    logging.basicConfig(
        level=level.upper(), stream=sys.stderr, format="%(levelname)s %(name)s %(message)s"
    )
    for noisy in ("pgserver", "alembic", "aiohttp.access"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLevelName(level.upper())))


def new_request_id() -> str:
    """A fresh request id."""
    return f"req_{uuid.uuid4().hex}"


def request_id_middleware(app: ASGIApp) -> ASGIApp:
    """Mint a request id and echo it on every response, with a ``Server-Timing`` header when the
    request reported its timings (``timing``).

    The id is always the server's: the usage ledger records each request once *by this id*, so a
    client choosing it could have a second request dropped as a duplicate (unbilled). A sane
    client-sent ``x-request-id`` is kept as ``client_request_id`` in the logs and echoed back as
    ``x-client-request-id``.
    """

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # type: ignore[comparison-overlap]
            await app(scope, receive, send)
            return
        incoming = next(
            (v.decode() for k, v in scope["headers"] if k == REQUEST_ID_HEADER.encode()), ""
        )
        client_id = incoming if _VALID_ID.match(incoming) else None
        request_id, started, timings = new_request_id(), time.perf_counter(), dict[str, float]()
        token, started_token = _timings.set(timings), _started.set(time.monotonic())
        after: list[Callable[[], None]] = []
        after_token = _after.set(after)
        scope.setdefault("state", {})["request_id"] = request_id
        structlog.contextvars.bind_contextvars(request_id=request_id)
        if client_id:
            structlog.contextvars.bind_contextvars(client_request_id=client_id)

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                if not any(k == REQUEST_ID_HEADER.encode() for k, _ in headers):
                    # (an idempotent replay already carries the original request's id)
                    headers.append((REQUEST_ID_HEADER.encode(), request_id.encode()))
                if client_id:
                    headers.append((CLIENT_REQUEST_ID_HEADER.encode(), client_id.encode()))
                if timings:
                    headers.append(
                        (SERVER_TIMING_HEADER.encode(), _server_timing(timings, started))
                    )
                message["headers"] = headers
            await send(message)

        try:
            await app(scope, receive, send_with_id)
        finally:
            _timings.reset(token)
            _started.reset(started_token)
            _after.reset(after_token)
            for callback in after:
                callback()
            structlog.contextvars.unbind_contextvars("request_id", "client_request_id")

    return middleware


def _server_span(scope: Scope) -> contextlib.AbstractContextManager[tracing.Served | None]:
    """The server span of an API request, its parent the client's ``traceparent`` (if any)."""
    method, path = str(scope.get("method", "")), str(scope.get("path", ""))
    incoming = next(
        (v.decode("latin-1") for k, v in scope["headers"] if k == TRACEPARENT_HEADER.encode()),
        None,
    )
    attributes = {
        "http.request.method": method,
        "url.path": path,
        "kiln.request_id": str(scope.get("state", {}).get("request_id", "")),
    }
    return tracing.server(f"{method} {path}", incoming, attributes)


def tracing_middleware(app: ASGIApp) -> ASGIApp:
    """The server span of an API request (installed only when tracing is on), inside
    ``request_id_middleware``: a client's ``traceparent`` is its parent, the response echoes the
    server span's, and its trace id joins the request id in every log line. A request the
    sampler leaves out gets its ids and ``traceparent`` but no span (``tracing.server``)."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        path = str(scope.get("path", ""))
        if scope["type"] != "http" or not path.startswith(TRACED_PREFIXES):  # type: ignore[comparison-overlap]
            await app(scope, receive, send)
            return
        with _server_span(scope) as served:
            if served is None:  # tracing turned off since the app was built (a test's)
                await app(scope, receive, send)
                return
            structlog.contextvars.bind_contextvars(trace_id=served.trace_id)
            span, echoed = served.span, served.traceparent.encode()

            async def send_traced(message: Message) -> None:
                if message["type"] == "http.response.start":
                    if span is not None:
                        span.set_attribute("http.response.status_code", message["status"])
                    headers = list(message.get("headers", []))
                    headers.append((TRACEPARENT_HEADER.encode(), echoed))
                    message["headers"] = headers
                await send(message)

            try:
                await app(scope, receive, send_traced)
            finally:
                structlog.contextvars.unbind_contextvars("trace_id")

    return middleware
