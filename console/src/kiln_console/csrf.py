"""CSRF tokens bound to the console session.

Litestar's double-submit check (the token in the form or ``x-csrftoken`` header must match the
``kiln_csrf`` cookie) stays; on top of it, sign-in issues a fresh token, keeps it in the
(encrypted) session, and every unsafe request of a signed-in session must carry that very token.
A token from another session (another browser's, or this browser's before sign-in) is refused.
"""

from __future__ import annotations

from secrets import compare_digest
from typing import TYPE_CHECKING, Any

from litestar.datastructures.cookie import Cookie
from litestar.enums import RequestEncodingType
from litestar.exceptions import PermissionDeniedException
from litestar.middleware.csrf import CSRFMiddleware, generate_csrf_token
from litestar.utils.scope.state import ScopeState

if TYPE_CHECKING:
    from litestar import Request
    from litestar.config.csrf import CSRFConfig
    from litestar.types import Receive, Scope, Send


class SessionCSRFMiddleware(CSRFMiddleware):
    """The double-submit check, and the session's own token for a signed-in session."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        session, method = scope.get("session"), scope.get("method", "GET")
        if (method not in self.config.safe_methods and isinstance(session, dict)
                and "uid" in session):  # fmt: skip
            request = scope["litestar_app"].request_class(scope=scope, receive=receive)
            sent = await _sent_token(request, self.config.header_name)
            bound = session.get("csrf")
            if not (isinstance(sent, str) and isinstance(bound, str)
                    and compare_digest(sent, bound)):  # fmt: skip
                raise PermissionDeniedException("CSRF token verification failed")
        await super().__call__(scope, receive, send)


async def _sent_token(request: Request[Any, Any, Any], header: str) -> object:
    token = request.headers.get(header)
    content_type, _ = request.content_type
    if not token and content_type in {RequestEncodingType.URL_ENCODED,
                                      RequestEncodingType.MULTI_PART}:  # fmt: skip
        token = (await request.form()).get("_csrf_token")
    return token


def session_token(request: Request[Any, Any, Any], config: CSRFConfig) -> tuple[str, list[Cookie]]:
    """A CSRF token for a session starting now, and the cookie that carries it (none when the
    CSRF middleware is already setting a fresh one on this safe request)."""
    if request.method in config.safe_methods and config.cookie_name not in request.cookies:
        token = ScopeState.from_scope(request.scope).csrf_token
        if isinstance(token, str):
            return token, []
    token = generate_csrf_token(config.secret)
    cookie = Cookie(
        key=config.cookie_name, value=token, path=config.cookie_path,
        secure=config.cookie_secure, httponly=config.cookie_httponly,
        samesite=config.cookie_samesite, domain=config.cookie_domain,
    )  # fmt: skip
    return token, [cookie]
