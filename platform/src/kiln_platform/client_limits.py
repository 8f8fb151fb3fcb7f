"""What one HTTP client may hold of the server: the uvicorn protocol ``kiln up`` serves with.

uvicorn (0.54) bounds none of this: a connection that sends nothing, or trickles its request
line and headers, is held forever (its keep-alive timer is armed only after a response); a
response's ``send`` waits as long as the client leaves its window full, so a stream whose
reader stopped holds its generation and the worker's slot until ``KILN_STREAM_TIMEOUT_S``; and
one address may open any number of connections. :func:`protocol` is uvicorn's
``HttpToolsProtocol`` with:

- headers: the request line and headers must arrive within ``KILN_HEADER_TIMEOUT_S`` of the
  connection opening (or of the first byte of a kept-alive connection's next request), in at
  most ``MAX_HEADER_BYTES``; else 408 / 431, and the connection is closed;
- sends: a send that waits ``KILN_SEND_TIMEOUT_S`` for the client to take bytes drops the
  connection, and the app sees the client hang up (a stream's generation is cancelled, the
  worker's slot freed, the tokens it made billed);
- connections: at most ``KILN_MAX_CONNECTIONS_PER_CLIENT`` open at once from one address
  (trusted proxies excepted: their clients are many); a request on one past it is refused by
  :func:`refusal_middleware` (429, in its API's error shape) and its connection closed.

A connection refused for its headers is closed the way nginx does it ("lingering close"): the
answer sent, the write side shut, what the client still sends read and dropped for
``LINGER_S``, so its own unread bytes do not reset the connection before the client reads the
answer.

The request body's timeout lives with its size limit (:mod:`kiln_platform.body_limit`).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import struct
from collections import Counter as Tally
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog
from litestar import Request
from prometheus_client import Counter
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from kiln_platform.errors import Overloaded

if TYPE_CHECKING:
    from collections.abc import Callable

    from litestar import Response
    from litestar.types import ASGIApp, Receive, Scope, Send

    from kiln_platform.settings import Settings

    Network = ipaddress.IPv4Network | ipaddress.IPv6Network
    ErrorRenderer = Callable[[Request[Any, Any, Any], Exception], Response[Any]]

MAX_HEADER_BYTES = 64 << 10
"""Most bytes of a request line and headers (nginx allows 32 KiB, Node.js 16 KiB)."""
LINGER_S = 2.0
OVER_LIMIT = "kiln.connections_over_limit"
"""Scope state key set on the requests of a connection past its address's limit."""
CUTS = Counter(
    "kiln_http_clients_cut",
    "Connections closed or refused for a client's slowness or number of connections.",
    ["reason"],
)
log = structlog.get_logger("kiln.clients")


@dataclass(frozen=True, slots=True)
class ClientLimits:
    """The limits (``Settings``), and the addresses whose connections are not counted."""

    header_timeout_s: float
    send_timeout_s: float
    max_connections: int
    """Per client address; 0: none."""
    trusted: tuple[Network, ...] | None = ()
    """Trusted proxies (``KILN_FORWARDED_ALLOW_IPS``); ``None``: every address (``*``)."""

    @classmethod
    def from_settings(cls, settings: Settings) -> ClientLimits:
        return cls(
            header_timeout_s=settings.header_timeout_s,
            send_timeout_s=settings.send_timeout_s,
            max_connections=settings.max_connections_per_client,
            trusted=_networks(settings.forwarded_allow_ips),
        )

    def counted(self, host: str) -> bool:
        """Whether ``host``'s connections are limited: a limit is set and it is no proxy."""
        if not self.max_connections or self.trusted is None:
            return False
        try:
            address = ipaddress.ip_address(host)
        except ValueError:  # a unix socket's peer: one local process
            return False
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
            address = address.ipv4_mapped  # a dual-stack listener's IPv4 client
        return not any(address in network for network in self.trusted)


def _networks(addresses: str) -> tuple[Network, ...] | None:
    """``KILN_FORWARDED_ALLOW_IPS`` as networks (``None`` for ``*``; unparsable items, such as
    a unix socket's path, are no address)."""
    items = [item.strip() for item in addresses.split(",") if item.strip()]
    if "*" in items:
        return None
    networks = []
    for item in items:
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            continue
    return tuple(networks)


def protocol(limits: ClientLimits) -> type[HttpToolsProtocol]:
    """The protocol class for ``uvicorn.run(http=...)``, with its own count of connections."""
    return type("KilnHttpProtocol", (_Guarded,), {"limits": limits, "open": Tally()})


class _Flow(FlowControl):
    """uvicorn's flow control whose wait for a writable transport ends in a hang-up."""

    def __init__(self, transport: asyncio.Transport, timeout_s: float) -> None:
        super().__init__(transport)
        self._timeout_s = timeout_s

    async def drain(self) -> None:
        try:
            async with asyncio.timeout(self._timeout_s):
                await self._is_writable_event.wait()
        except TimeoutError:
            CUTS.labels("send_timeout").inc()
            log.warning("client took no bytes within the send timeout; connection dropped",
                        timeout_s=self._timeout_s)  # fmt: skip
            _reset(self._transport)
            await self._is_writable_event.wait()  # set by connection_lost: the send returns


class _Guarded(HttpToolsProtocol):
    limits: ClientLimits
    open: Tally[str]
    """Open connections by client address (of this server's protocol class)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._host: str | None = None
        self._over = self._lingering = False
        self._headers_due: asyncio.TimerHandle | None = None
        self._header_bytes = 0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.flow = _Flow(transport, self.limits.send_timeout_s)
        host = self.client[0] if self.client else None
        if host is not None and self.limits.counted(host):
            self._host = host
            self.open[host] += 1
            self._over = self.open[host] > self.limits.max_connections
        self._expect_headers()

    def connection_lost(self, exc: Exception | None) -> None:
        self._headers_arrived()
        if self._host is not None:
            self.open[self._host] -= 1
            if not self.open[self._host]:
                del self.open[self._host]
            self._host = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            return
        if self._headers_due is not None:
            self._header_bytes += len(data)
        super().data_received(data)
        if self._headers_due is not None and self._header_bytes > MAX_HEADER_BYTES:
            message = f"The request's line and headers are larger than {MAX_HEADER_BYTES} bytes."
            self._refuse(431, "header_too_large", message)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._expect_headers()
        if self._over:
            self.scope["state"][OVER_LIMIT] = self.limits.max_connections

    def on_headers_complete(self) -> None:
        self._headers_arrived()
        super().on_headers_complete()
        if self._over and self.cycle is not None:
            self.cycle.keep_alive = False  # one answer (the 429), then closed

    def _expect_headers(self) -> None:
        if self._headers_due is None:
            self._header_bytes = 0
            due = self.limits.header_timeout_s
            self._headers_due = self.loop.call_later(due, self._headers_late)

    def _headers_arrived(self) -> None:
        if self._headers_due is not None:
            self._headers_due.cancel()
            self._headers_due = None

    def _headers_late(self) -> None:
        self._headers_due = None
        message = f"The request's headers did not arrive within {self.limits.header_timeout_s:g} s."
        self._refuse(408, "header_timeout", message)

    def _refuse(self, status: int, reason: str, message: str) -> None:
        """Answer ``status`` (unless a response is under way) and close, lingering."""
        self._headers_arrived()
        if self.transport.is_closing():
            return
        CUTS.labels(reason).inc()
        log.info("client refused", reason=reason, client=self._host or self.client)
        if self.cycle is not None and not self.cycle.response_complete:
            _reset(self.transport)  # mid-response: no room for an answer
            return
        self.transport.write(_plain(status, message))
        self._lingering = True
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(LINGER_S, self.transport.close)


def _plain(status: int, message: str) -> bytes:
    """A whole HTTP/1.1 response with a text body, closing the connection."""
    phrase = {408: "Request Timeout", 431: "Request Header Fields Too Large"}[status]
    body = message.encode()
    head = (f"HTTP/1.1 {status} {phrase}\r\ncontent-type: text/plain; charset=utf-8\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n")  # fmt: skip
    return head.encode() + body


def _reset(transport: asyncio.Transport) -> None:
    """Drop the connection at once, unsent bytes and all (an RST: nothing is kept in the
    kernel for a client that reads nothing)."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


def refusal_middleware(app: ASGIApp, errors: ErrorRenderer) -> ASGIApp:
    """Answer 429 to each request of a connection past its address's limit (its protocol
    closes the connection after it), rendered by ``errors`` in the shape of its API."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        limit = scope.get("state", {}).get(OVER_LIMIT)
        if scope["type"] != "http" or limit is None:  # type: ignore[comparison-overlap]
            await app(scope, receive, send)
            return
        CUTS.labels("connections").inc()
        exc = Overloaded(
            f"Too many connections from your address: at most {limit} at once. Reuse "
            "connections, or retry once one of yours is closed.",
            retry_after=1.0,
        )
        request: Request[Any, Any, Any] = Request(scope)
        await errors(request, exc).to_asgi_response(None, request)(scope, receive, send)

    return middleware
