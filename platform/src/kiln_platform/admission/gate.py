"""The shed gate: an ASGI middleware that repeats a pool's recent refusal to the requests that
follow, before the request path runs (``admission.shed``).

It acts only while some refusal is held, on ``POST /v1/embeddings`` with an API key this
process verified within its TTL: it reads the body (under ``body_limit``'s bound), peeks at its
``model`` and either answers the held refusal or hands the body on as if unread. Anything it
cannot judge cheaply (an unknown or expired key, an OAuth token, a malformed header or body)
passes through: the route answers it as without the gate.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec
from litestar import Request
from litestar.datastructures import Headers

from kiln_platform.admission.deps import priority_of, timeout_of
from kiln_platform.errors import KilnError

if TYPE_CHECKING:
    from collections.abc import Callable

    from litestar import Response
    from litestar.types import (
        ASGIApp,
        HTTPRequestEvent,
        Receive,
        ReceiveMessage,
        Scope,
        Send,
    )

    from kiln_platform.context import Kiln

    ErrorRenderer = Callable[[Request[Any, Any, Any], Exception], Response[Any]]

GATED = frozenset({"/v1/embeddings"})
"""The routes whose refusals are held (those that ``WorkerClient.screen`` before tokenizing)."""


class _Target(msgspec.Struct):
    model: str


_peek = msgspec.json.Decoder(_Target)


def shed_middleware(app: ASGIApp, errors: ErrorRenderer) -> ASGIApp:
    """Wrap the app; ``errors`` renders a refusal as the route's own error handler does."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in GATED:  # type: ignore[comparison-overlap]
            await app(scope, receive, send)
            return
        kiln: Kiln = scope["app"].state.kiln
        refusals = kiln.admissions.refusals
        post = scope.get("method") == "POST"
        terms = _terms(kiln, scope) if refusals and post else None
        if terms is None:
            await app(scope, receive, send)
            return
        body = await _read(receive)
        if body is None:  # the client went away
            return
        refusal = refusals.refusal(terms[0], _model(body), terms[1], terms[2])
        if refusal is None:
            await app(scope, _replay(body, receive), send)
            return
        request: Request[Any, Any, Any] = Request(scope)
        await errors(request, refusal).to_asgi_response(None, request)(scope, receive, send)

    return middleware


def _terms(kiln: Kiln, scope: Scope) -> tuple[str, Any, float] | None:
    """(tenant, priority, timeout) of a request from a cached API key, else None."""
    headers = Headers.from_scope(scope)
    kind, _, token = headers.get("authorization", "").partition(" ")
    principal = kiln.keys.cached(token.strip()) if kind.lower() == "bearer" else None
    if principal is None or "inference" not in principal.scopes or principal.role == "finance":
        return None
    try:
        priority = priority_of(headers)
        timeout_s = timeout_of(headers, kiln.settings.request_timeout_s)
    except KilnError:
        return None
    return str(principal.tenant_id), priority, timeout_s


def _model(body: bytes) -> str:
    """The body's ``model`` ("" when it has none: nothing is held for that)."""
    try:
        return _peek.decode(body).model
    except msgspec.DecodeError:
        return ""


async def _read(receive: Receive) -> bytes | None:
    """The whole body (bounded by ``body_limit``'s ``receive``); None if the client left."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk: bytes = message.get("body", b"")  # type: ignore[assignment]
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """``receive`` that hands the route the body read ahead first."""
    pending = True

    async def replayed() -> ReceiveMessage:
        nonlocal pending
        if pending:
            pending = False
            message: HTTPRequestEvent = {"type": "http.request", "body": body, "more_body": False}
            return message
        return await receive()

    return replayed
