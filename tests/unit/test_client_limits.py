"""The pure parts of the slow-client limits: whose connections are counted, and the request
body's deadline (the protocol itself runs in ``tests/e2e/test_slow_clients.py``)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from litestar import Response

from kiln_platform.body_limit import BodyLimits, body_limit_middleware
from kiln_platform.client_limits import ClientLimits
from kiln_platform.settings import Settings

pytestmark = pytest.mark.unit


def _limits(proxies: str, most: int = 8) -> ClientLimits:
    settings = Settings(forwarded_allow_ips=proxies, max_connections_per_client=most)
    return ClientLimits.from_settings(settings)


@pytest.mark.parametrize(
    ("proxies", "most", "host", "counted"),
    [
        ("", 8, "127.0.0.1", True),
        ("", 8, "::1", True),
        ("10.0.0.0/8, 192.168.1.5", 8, "10.2.3.4", False),  # a trusted proxy's clients are many
        ("10.0.0.0/8, 192.168.1.5", 8, "192.168.1.5", False),
        ("10.0.0.0/8, 192.168.1.5", 8, "192.168.1.6", True),
        ("10.0.0.0/8", 8, "::ffff:10.2.3.4", False),  # on a dual-stack listener
        ("10.0.0.0/8", 8, "::ffff:11.2.3.4", True),
        ("unix:/run/kiln.sock,10.0.0.1", 8, "10.0.0.2", True),  # a path is no address
        ("*", 8, "203.0.113.9", False),
        ("", 0, "203.0.113.9", False),  # no limit
        ("", 8, "", False),  # a unix socket's peer
    ],
)
def test_whose_connections_are_counted(proxies: str, most: int, host: str, counted: bool) -> None:
    assert _limits(proxies, most).counted(host) is counted


async def _post(pieces: list[tuple[float, bytes]], after: float | None = None) -> dict[str, Any]:
    """Run a body of ``pieces`` ((delay, bytes), the last ending it) through the middleware
    with a 0.2 s body timeout into an app that reads it all, then (``after``) waits for the
    client to hang up; returns the status, headers and what the app read."""
    read = bytearray()
    queue = list(pieces)

    async def receive() -> dict[str, Any]:
        if not queue:
            await asyncio.sleep(after or 0)
            return {"type": "http.disconnect"}
        delay, piece = queue.pop(0)
        await asyncio.sleep(delay)
        return {"type": "http.request", "body": piece, "more_body": bool(queue)}

    async def app(scope: Any, receive: Any, send: Any) -> None:
        more = True
        while more:
            message = await receive()
            read.extend(message.get("body", b""))
            more = message.get("more_body", False)
        if after is not None:
            assert (await receive())["type"] == "http.disconnect"
        await Response({"read": len(read)}).to_asgi_response(None, None)(scope, receive, send)  # type: ignore[arg-type]

    def errors(request: Any, exc: Exception) -> Response[Any]:
        return Response({"error": str(exc)}, status_code=getattr(exc, "status_code", 500))

    limits = BodyLimits(json=1 << 20, tensor=1 << 20, upload=1 << 20, timeout_s=0.2)
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope: dict[str, Any] = {
        "type": "http", "path": "/v1/embeddings", "headers": [], "method": "POST",
        "query_string": b"", "root_path": "", "scheme": "http", "server": None,
    }  # fmt: skip
    await body_limit_middleware(app, limits, errors)(scope, receive, send)  # type: ignore[arg-type]
    start = sent[0]
    return {"status": start["status"], "headers": dict(start["headers"]), "read": len(read)}


def test_a_body_that_keeps_coming_is_read_whole() -> None:
    # 10 KiB in 0.3 s: past the 0.2 s grace, but faster than MIN_BODY_RATE
    pieces = [(0.1, b"x" * 4096), (0.1, b"x" * 4096), (0.1, b"x" * 2048)]
    answer = asyncio.run(_post(pieces))
    assert (answer["status"], answer["read"]) == (200, 10240)


def test_a_stalled_body_is_408_and_closes_the_connection() -> None:
    answer = asyncio.run(_post([(0.0, b"x" * 10), (1.0, b"x")]))
    assert answer["status"] == 408
    assert answer["headers"][b"connection"] == b"close"


def test_a_trickled_body_is_408_though_no_gap_is_long() -> None:
    # a byte every 0.05 s: each gap well under the 0.2 s timeout, 20 bytes/s far under the rate
    answer = asyncio.run(_post([(0.05, b"x")] * 40))
    assert answer["status"] == 408
    assert answer["read"] < 10


def test_waiting_for_the_hang_up_after_the_body_is_not_timed() -> None:
    # a streamed response listens for the disconnect for as long as it runs
    answer = asyncio.run(_post([(0.0, b"{}")], after=0.5))
    assert answer["status"] == 200
