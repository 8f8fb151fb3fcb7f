"""Adds the rate-limit headers admission computed, holds a response with a deadline to it, and
releases its concurrency lease and any budget reservation the ledger was not handed when the
response (streams included) is finished, however it finishes."""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

import structlog

from kiln_platform.quotas.enforcer import Admission

if TYPE_CHECKING:
    from litestar.types import ASGIApp, Message, Receive, Scope, Send

STATE_KEY = "kiln_quota"
SEND_GRACE_S = 5.0
"""How long past its deadline a response may take to reach a client that stopped reading: time
for the last events a generation cut at its deadline sends."""
log = structlog.get_logger("kiln.quotas")


def admission_of(scope: Scope) -> Admission:
    """The request's admission record (created on first use)."""
    state = scope.setdefault("state", {})
    admission: Admission = state.setdefault(STATE_KEY, Admission())
    return admission


def quota_middleware(app: ASGIApp) -> ASGIApp:
    """Wrap the app: headers on the response start, sends held to the response's deadline, and
    at the very end its closers run and its lease and hold are released."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # type: ignore[comparison-overlap]
            await app(scope, receive, send)
            return
        cut = False

        async def send_held(message: Message) -> None:
            nonlocal cut
            admission = scope.get("state", {}).get(STATE_KEY)
            if message["type"] == "http.response.start" and admission and admission.headers:
                headers = list(message.get("headers", []))
                headers += [(k.encode(), v.encode()) for k, v in admission.headers.items()]
                message["headers"] = headers
            if admission is None or admission.deadline is None:
                await send(message)
                return
            try:
                async with asyncio.timeout_at(admission.deadline + SEND_GRACE_S):
                    await send(message)
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
        finally:
            state, kiln = scope.get("state", {}), scope["app"].state.kiln
            admission = state.get(STATE_KEY)
            if admission is not None:
                for close in admission.closers:  # e.g. a stream cut mid-send: its generation
                    with contextlib.suppress(Exception):
                        await close()
                if admission.lease is not None:
                    await kiln.quotas.release(admission.lease)
            if "request_id" in state:
                await kiln.budgets.finish(state["request_id"])

    return middleware
