"""Adds the rate-limit headers admission computed, and releases its concurrency lease and any
budget reservation the ledger was not handed when the response (streams included) is finished."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kiln_platform.quotas.enforcer import Admission

if TYPE_CHECKING:
    from litestar.types import ASGIApp, Message, Receive, Scope, Send

STATE_KEY = "kiln_quota"


def admission_of(scope: Scope) -> Admission:
    """The request's admission record (created on first use)."""
    state = scope.setdefault("state", {})
    admission: Admission = state.setdefault(STATE_KEY, Admission())
    return admission


def quota_middleware(app: ASGIApp) -> ASGIApp:
    """Wrap the app: headers on the response start, lease released at the very end."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # type: ignore[comparison-overlap]
            await app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                admission = scope.get("state", {}).get(STATE_KEY)
                if admission is not None and admission.headers:
                    headers = list(message.get("headers", []))
                    headers += [(k.encode(), v.encode()) for k, v in admission.headers.items()]
                    message["headers"] = headers
            await send(message)

        try:
            await app(scope, receive, send_with_headers)
        finally:
            state, kiln = scope.get("state", {}), scope["app"].state.kiln
            admission = state.get(STATE_KEY)
            if admission is not None and admission.lease is not None:
                await kiln.quotas.release(admission.lease)
            if "request_id" in state:
                await kiln.budgets.finish(state["request_id"])

    return middleware
