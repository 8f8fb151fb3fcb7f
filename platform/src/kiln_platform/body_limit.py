"""Request bodies bounded before they are read: the outermost reader of every route's body.

Each route has one limit (:meth:`BodyLimits.of`). A declared ``Content-Length`` above it is
refused before a byte is read; otherwise the ``receive`` every later middleware and the route
see counts the bytes it hands out and raises :class:`~kiln_platform.errors.PayloadTooLarge`
the moment they pass the limit, whatever the headers said (a lying Content-Length, chunked
transfer). So no reader downstream (the idempotency fingerprint, Litestar's ``request.body()``,
an upload's stream) can pull more than the limit.

The connection is kept: uvicorn discards the rest of the body as it arrives (never buffered),
so a client that sends its whole body before reading (httpx, the openai SDK) still gets the
413. ``Connection: close`` would make uvicorn close with unread data, which resets the
connection and loses the answer: the SDKs then see a network error and send the body again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from litestar import Request
from litestar.types import Empty

from kiln_platform.errors import PayloadTooLarge

if TYPE_CHECKING:
    from collections.abc import Callable

    from litestar import Response
    from litestar.types import ASGIApp, Message, Receive, ReceiveMessage, Scope, Send

    from kiln_platform.settings import Settings

    ErrorRenderer = Callable[[Request[Any, Any, Any], Exception], Response[Any]]

SMALL_BODY_BYTES = 1 << 20
"""Every route that is not `/v1`, `/v2` or an upload: `/admin/v1` and `/oauth` JSON, forms."""


@dataclass(frozen=True, slots=True)
class BodyLimits:
    """The most bytes a request body may have, by kind of route."""

    json: int
    """`/v1` (OpenAI JSON): ``KILN_MAX_JSON_BODY_BYTES``."""
    tensor: int
    """`/v2` (OIP JSON or binary tensors): ``KILN_MAX_TENSOR_BODY_BYTES``."""
    upload: int
    """Routes that stream a file (``request_max_body_size=None``): ``KILN_MAX_UPLOAD_BYTES``."""
    small: int = SMALL_BODY_BYTES

    @classmethod
    def from_settings(cls, settings: Settings) -> BodyLimits:
        """The limits the settings configure."""
        return cls(
            json=settings.max_json_body_bytes,
            tensor=settings.max_tensor_body_bytes,
            upload=settings.max_upload_bytes,
        )

    def of(self, scope: Scope) -> int:
        """The limit of the request's route.

        A handler's own ``request_max_body_size`` wins: an integer is its limit, ``None`` marks
        an upload streamed to disk. Otherwise the path decides.
        """
        handler = scope.get("route_handler")
        own = getattr(handler, "request_max_body_size", Empty)
        if own is None:
            return self.upload
        if isinstance(own, int):
            return own
        path: str = scope["path"]
        if path.startswith("/v1/"):
            return self.json
        if path.startswith("/v2/"):
            return self.tensor
        return self.small


def body_limit_middleware(app: ASGIApp, limits: BodyLimits, errors: ErrorRenderer) -> ASGIApp:
    """Wrap the app; ``errors`` renders the 413 in the shape of the API it answers for."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # type: ignore[comparison-overlap]
            await app(scope, receive, send)
            return
        limit = limits.of(scope)
        started = False

        async def send_noting(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            if _declared(scope) > limit:
                raise _too_large(limit)
            await app(scope, _counting(receive, limit), send_noting)
        except PayloadTooLarge as exc:
            if started:  # the route answered before reading on; nothing more to say
                return
            request: Request[Any, Any, Any] = Request(scope)
            await errors(request, exc).to_asgi_response(None, request)(scope, receive, send)

    return middleware


def _declared(scope: Scope) -> int:
    """The Content-Length the client announced (0 when absent or not a number)."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            return int(value) if value.isdigit() else 0
    return 0


def _counting(receive: Receive, limit: int) -> Receive:
    """``receive``, raising ``PayloadTooLarge`` once the body passes ``limit`` bytes."""
    seen = 0

    async def counted() -> ReceiveMessage:
        nonlocal seen
        if seen > limit:
            raise _too_large(limit)
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise _too_large(limit)
        return message

    return counted


def _too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"The request body is larger than this endpoint's {limit}-byte limit.")
