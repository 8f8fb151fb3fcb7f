"""The Idempotency-Key middleware on POSTs of ``/v1`` and ``/admin/v1``.

A request without the header passes straight through. With it: authenticate (the routes' own
cached ``verify_bearer``; a failure passes through so the route answers 401), run the route's
guards (an upload is authorized before its body is read, here as without the header),
fingerprint the query string and body, claim the key, then either run the route and store its
response (a stream as the bytes sent) or replay the stored one with ``Idempotent-Replayed: true``.
"""

from __future__ import annotations

import asyncio
import contextlib
from hashlib import sha256
from typing import TYPE_CHECKING, Any

import structlog
from litestar import Request, Response

from kiln_platform.db.outage import DB_UNREACHABLE, unreachable
from kiln_platform.errors import BadRequest, IdempotencyInProgress, KilnError, ServiceUnavailable
from kiln_platform.gateway.auth import verify_bearer
from kiln_platform.idempotency._body import Body, ClientGone
from kiln_platform.idempotency.services import HEADER, KeyScope, StoredResponse

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from litestar.types import ASGIApp, Message, Receive, Scope, Send

    from kiln_platform.context import Kiln
    from kiln_platform.idempotency.services import IdempotencyStore
    from kiln_platform.keys.services import Principal

    ErrorRenderer = Callable[[Request[Any, Any, Any], Exception], Response[Any]]

log = structlog.get_logger("kiln.idempotency")
PATHS = ("/v1/", "/admin/v1/")
MAX_KEY = 255
MAX_STORED_BYTES = 64 << 20
NOT_STORED = frozenset({401, 403, 408, 409, 425, 429})
"""Answers about the moment, not the request: a retry should run it (so do 5xx)."""
NOT_REPLAYED = frozenset({
    "content-length", "date", "server", "connection", "transfer-encoding", "retry-after",
    "set-cookie", "idempotent-replayed",
})  # fmt: skip
SSE_DONE = b"data: [DONE]\n\n"
_KEY = HEADER.lower().encode()


def idempotency_middleware(app: ASGIApp, errors: ErrorRenderer) -> ASGIApp:
    """Wrap the app; ``errors`` renders a Kiln error in the shape of the API it answers for."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        key = _key_of(scope)
        if key is None:
            await app(scope, receive, send)
            return
        kiln: Kiln = scope["app"].state.kiln
        principal = await _caller(kiln, scope)
        if principal is None:  # the route answers 401 (or 403) itself
            await app(scope, receive, send)
            return
        try:
            await _guarded(scope)
            await _unless_unreachable(
                _idempotent(app, kiln.idempotency, principal, key, (scope, receive, send))
            )
        except KilnError as exc:
            extra = {"x-should-retry": "true"} if isinstance(exc, IdempotencyInProgress) else {}
            request: Request[Any, Any, Any] = Request(scope)
            response = errors(request, exc).to_asgi_response(None, request, headers=extra)
            await response(scope, receive, send)
        except ClientGone:
            return

    return middleware


async def _unless_unreachable(work: Awaitable[None]) -> None:
    """Run ``work``; the database unreachable: 503 + Retry-After (not 500)."""
    try:
        await work
    except Exception as exc:
        if unreachable(exc):
            raise ServiceUnavailable(DB_UNREACHABLE, retry_after=5.0) from exc
        raise


async def _guarded(scope: Scope) -> None:
    """Run the route's guards (an upload's authorization) before the body is read ahead."""
    handler = scope.get("route_handler")
    if handler is not None and handler.resolve_guards():
        await handler.authorize_connection(Request(scope))


def _key_of(scope: Scope) -> str | None:
    """The Idempotency-Key of a POST to ``/v1`` or ``/admin/v1``, else None (the fast path)."""
    if scope["type"] != "http" or scope["method"] != "POST":  # type: ignore[comparison-overlap,typeddict-item]
        return None
    for name, value in scope["headers"]:
        if name == _KEY:
            return value.decode("latin-1") if scope["path"].startswith(PATHS) else None
    return None


async def _caller(kiln: Kiln, scope: Scope) -> Principal | None:
    for name, value in scope["headers"]:
        if name == b"authorization":
            kind, _, token = value.decode("latin-1").partition(" ")
            if kind.lower() != "bearer" or not token.strip():
                return None
            with contextlib.suppress(KilnError):
                return await verify_bearer(kiln, token.strip())
            return None
    return None


def _credential(principal: Principal) -> str:
    """``key:<id>``, or the OAuth client (``oauth:<client id>``)."""
    return f"key:{principal.key_id}" if principal.key_id else principal.name[:80]


def _path(path: str) -> str:
    """The path, or a long one's prefix and digest (the column holds 300 characters)."""
    return path if len(path) <= 300 else f"{path[:200]}#{sha256(path.encode()).hexdigest()}"


async def _idempotent(
    app: ASGIApp, store: IdempotencyStore, principal: Principal, key: str,
    asgi: tuple[Scope, Receive, Send],
) -> None:  # fmt: skip
    scope, receive, send = asgi
    if not 0 < len(key) <= MAX_KEY:
        raise BadRequest(f"The {HEADER} header must be 1 to {MAX_KEY} characters.", param=HEADER)
    mac = store.fingerprinter()
    mac.update(scope["query_string"] + b"\n")
    body = await Body.read(receive, mac)
    try:
        where = KeyScope(
            principal.tenant_id, _credential(principal), "POST", _path(scope["path"]), key
        )
        request_id: str = scope["state"]["request_id"]
        stored = await store.claim(where, mac.digest(), request_id)
        if stored is not None:
            await _replay(stored, send)
            return
        claim = _Claim(store, where, request_id)
        await claim.run(app, scope, body.receive(receive), send)
    finally:
        body.close()


async def _replay(stored: StoredResponse, send: Send) -> None:
    headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in stored.headers.items()]
    headers += [
        (b"content-length", str(len(stored.body)).encode()),
        (b"idempotent-replayed", b"true"),
    ]
    await send({"type": "http.response.start", "status": stored.status, "headers": headers})
    await send({"type": "http.response.body", "body": stored.body, "more_body": False})


class _Claim:
    """A claimed key: run the route once, store its response before its last byte goes out (so
    a retry that follows the response finds it; for a stream, its ``[DONE]`` event), or give the
    key up."""

    def __init__(self, store: IdempotencyStore, where: KeyScope, request_id: str) -> None:
        self.store, self.where, self.request_id = store, where, request_id
        self.start: dict[str, Any] = {}
        self.chunks: list[bytes] = []
        self.size = 0
        self.ended = False
        self.stored = False

    async def run(self, app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
        """Run the route; release the key unless its response was stored."""

        async def record(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.start.update(message)
            elif message["type"] == "http.response.body":
                chunk: bytes = message.get("body", b"")
                self.size += len(chunk)
                if self.size <= MAX_STORED_BYTES:
                    self.chunks.append(chunk)
                # an event stream is complete at its [DONE] event: the openai SDK hangs up then,
                # before the empty frame that ends the HTTP body
                last = not message.get("more_body", False) or chunk.endswith(SSE_DONE)
                if last and not self.ended:
                    self.ended = True
                    self.stored = await self._store()
            await send(message)

        renewing = asyncio.create_task(_renew(self.store, self.where, self.request_id))
        try:
            await app(scope, receive, record)
        finally:
            renewing.cancel()
            if not self.stored:  # not storable, failed, or a stream the client cut
                with contextlib.suppress(Exception):
                    await self.store.release(self.where, self.request_id)

    async def _store(self) -> bool:
        status = int(self.start.get("status", 500))
        if status >= 500 or status in NOT_STORED or self.size > MAX_STORED_BYTES:
            return False
        headers = {
            k.decode("latin-1").lower(): v.decode("latin-1")
            for k, v in self.start.get("headers", [])
        }
        headers = {
            k: v for k, v in headers.items()
            if k not in NOT_REPLAYED and not k.startswith("x-ratelimit-")
        }  # fmt: skip
        headers["x-request-id"] = self.request_id
        response = StoredResponse(status, headers, b"".join(self.chunks))
        try:
            await self.store.complete(self.where, self.request_id, response)
        except Exception:  # the response still goes out; the claim lapses and a retry runs it
            log.exception("storing an idempotent response failed")
            return False
        return True


async def _renew(store: IdempotencyStore, where: KeyScope, request_id: str) -> None:
    while True:
        await asyncio.sleep(store.lock_s / 3)
        with contextlib.suppress(Exception):
            await store.renew(where, request_id)
