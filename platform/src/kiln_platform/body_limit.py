"""Request bodies bounded in size and time before they are read: the outermost reader of every
route's body.

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

A body that stalls, or trickles slower than ``MIN_BODY_RATE`` once ``KILN_BODY_TIMEOUT_S`` has
passed, is answered 408 with ``Connection: close``: the client holds no worker or memory longer.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from litestar import Request
from litestar.types import Empty

from kiln_platform.errors import PayloadTooLarge, RequestTimeout

if TYPE_CHECKING:
    from collections.abc import Callable

    from litestar import Response
    from litestar.types import ASGIApp, Message, Receive, ReceiveMessage, Scope, Send

    from kiln_platform.settings import Settings

    ErrorRenderer = Callable[[Request[Any, Any, Any], Exception], Response[Any]]

SMALL_BODY_BYTES = 1 << 20
"""Every route that is not `/v1`, `/v2` or an upload: `/admin/v1` and `/oauth` JSON, forms."""
VLLM_PATHS = frozenset(
    {"/tokenize", "/detokenize", "/score", "/rerank", "/classify", "/v2/rerank", "/v2/embed"}
)
"""vLLM's API routes outside `/v1` (at the root, and Cohere's v2 rerank and embed): bodies as
large as `/v1`'s (a rerank of many documents)."""
MIN_BODY_RATE = 1024
"""Bytes a second a request body must average once ``KILN_BODY_TIMEOUT_S`` has passed."""


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
    timeout_s: float = 30.0
    """``KILN_BODY_TIMEOUT_S``: the grace before a body must arrive at ``MIN_BODY_RATE``."""

    @classmethod
    def from_settings(cls, settings: Settings) -> BodyLimits:
        """The limits the settings configure."""
        return cls(
            json=settings.max_json_body_bytes,
            tensor=settings.max_tensor_body_bytes,
            upload=settings.max_upload_bytes,
            timeout_s=settings.body_timeout_s,
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
        if path.startswith("/v1/") or path in VLLM_PATHS:
            return self.json
        if path.startswith("/v2/"):
            return self.tensor
        return self.small


def body_limit_middleware(app: ASGIApp, limits: BodyLimits, errors: ErrorRenderer) -> ASGIApp:
    """Wrap the app; ``errors`` renders the 413 or 408 in the shape of the API it answers for."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # type: ignore[comparison-overlap]
            await app(scope, receive, send)
            return
        limit = limits.of(scope)
        body = _Body(receive, limit, limits.timeout_s)
        started = False

        async def send_noting(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                if body.stalled:  # the client may still trickle: answer, then close
                    message["headers"] = [*message.get("headers", ()), (b"connection", b"close")]
            await send(message)

        try:
            if _declared(scope) > limit:
                raise _too_large(limit)
            await app(scope, body.receive, send_noting)
        except (PayloadTooLarge, RequestTimeout) as exc:
            if started:  # the route answered before reading on; nothing more to say
                return
            request: Request[Any, Any, Any] = Request(scope)
            await errors(request, exc).to_asgi_response(None, request)(scope, receive, send_noting)

    return middleware


def _declared(scope: Scope) -> int:
    """The Content-Length the client announced (0 when absent or not a number)."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            return int(value) if value.isdigit() else 0
    return 0


class _Body:
    """``receive``, raising ``PayloadTooLarge`` once the body passes ``limit`` bytes and
    ``RequestTimeout`` once its next bytes are later than ``timeout_s`` plus a second per
    ``MIN_BODY_RATE`` bytes already in (from its first read): a stalled body and a trickled
    one both end there, a body sent at any usable speed never does."""

    def __init__(self, receive: Receive, limit: int, timeout_s: float) -> None:
        self._receive, self._limit, self._timeout_s = receive, limit, timeout_s
        self.seen = 0
        self._began: float | None = None
        self._done = False
        self.stalled = False

    async def receive(self) -> ReceiveMessage:
        if self.seen > self._limit:
            raise _too_large(self._limit)
        if self._done:  # the body is in: what is left to receive is the client hanging up
            return await self._receive()
        now = asyncio.get_running_loop().time()
        self._began = now if self._began is None else self._began
        due = self._began + self._timeout_s + self.seen / MIN_BODY_RATE
        try:
            async with asyncio.timeout_at(due):
                message = await self._receive()
        except TimeoutError:
            self.stalled = True
            raise RequestTimeout(
                f"The request body stalled: {self.seen} bytes in {due - self._began:.0f} s "
                f"(after {self._timeout_s:g} s it must average {MIN_BODY_RATE} bytes a second)."
            ) from None
        self._done = message["type"] != "http.request" or not message.get("more_body", False)
        if message["type"] == "http.request":
            self.seen += len(message.get("body", b""))
            if self.seen > self._limit:
                raise _too_large(self._limit)
        return message


def _too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"The request body is larger than this endpoint's {limit}-byte limit.")
