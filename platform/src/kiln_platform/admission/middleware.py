"""Opens each request's admission and leaves it when the response (streams included) is over,
however it ends; adds the rate-limit headers the quotas computed and holds a response with a
deadline to it, cutting a client that stops reading."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import structlog

if TYPE_CHECKING:
    from litestar.types import ASGIApp, Message, Receive, Scope, Send

    from kiln_platform.admission.services import Admission, Admissions

SEND_GRACE_S = 5.0
"""How long past its deadline a response may take to reach a client that stopped reading: time
for the last events a generation cut at its deadline sends."""
log = structlog.get_logger("kiln.admission")


def admission_middleware(app: ASGIApp) -> ASGIApp:
    """Wrap the app: one admission per HTTP request, entered by the handler's dependencies and
    left here at the very end."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # type: ignore[comparison-overlap]
            await app(scope, receive, send)
            return
        desk: Admissions = scope["app"].state.kiln.admissions
        cut = False
        async with desk.open(scope.setdefault("state", {})) as admission:

            async def send_held(message: Message) -> None:
                nonlocal cut
                try:
                    await _send(admission, send, message)
                except TimeoutError:
                    cut = True
                    raise

            try:
                await app(scope, receive, send_held)
            except Exception:
                if not cut:
                    raise
                # the server closes a connection whose response did not complete
                log.info("response past its deadline to a client not reading; connection dropped")

    return middleware


async def _send(admission: Admission, send: Send, message: Message) -> None:
    """Send with the rate-limit headers on the response start, within the deadline's grace."""
    if message["type"] == "http.response.start":
        admission.response_status = message["status"]
    if message["type"] == "http.response.start" and admission.grant.headers:
        headers = list(message.get("headers", []))
        headers += [(k.encode(), v.encode()) for k, v in admission.grant.headers.items()]
        message["headers"] = headers
    if admission.deadline is None:
        await send(message)
        return
    async with asyncio.timeout_at(admission.deadline + SEND_GRACE_S):
        await send(message)
