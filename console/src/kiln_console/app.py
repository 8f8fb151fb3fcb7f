"""The console as one Litestar router, mounted by the platform app at ``/console``.

Sign-in sets an encrypted session cookie (AES-GCM, keyed from the server secret); every unsafe
request must carry the CSRF token (htmx sends it as a header, plain forms as a field), and a
signed-in session's must be the token issued with it (``kiln_console.csrf``). Both
cookies are confined to ``/console``, so the API is untouched: it keeps its bearer credentials.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from litestar import Router
from litestar.config.csrf import CSRFConfig
from litestar.contrib.jinja import JinjaTemplateEngine
from litestar.di import Provide
from litestar.exceptions import PermissionDeniedException
from litestar.middleware import DefineMiddleware
from litestar.middleware.session import SessionMiddleware
from litestar.middleware.session.client_side import ClientSideSessionBackend, CookieBackendConfig
from litestar.static_files import create_static_files_router
from litestar.template.config import TemplateConfig

from kiln_console import (
    adapters,
    audit,
    auth,
    costs,
    errors,
    finance,
    logs,
    members,
    models,
    overview,
    pages,
    slos,
    webhooks,
)
from kiln_console.csrf import SessionCSRFMiddleware
from kiln_console.sso import OpenIDProvider
from kiln_platform.users.throttle import SignInThrottle

if TYPE_CHECKING:
    from litestar.types import ASGIApp, Receive, Scope, Send

    from kiln_platform.settings import Settings

HERE = Path(__file__).parent
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})
PREFIX = "/console"
SESSION_S = 8 * 3600


@dataclass(frozen=True)
class Console:
    """What the platform app mounts: the router and the template engine its pages render with."""

    router: Router
    templates: TemplateConfig[JinjaTemplateEngine]


def _sessions(app: ASGIApp, config: CookieBackendConfig) -> SessionMiddleware[Any]:
    """The session middleware, built when the app is (a router's middleware is deep-copied, and
    the backend's AES-GCM cipher cannot be)."""
    return SessionMiddleware(app, backend=ClientSideSessionBackend(config=config))


def _provider(settings: Settings) -> OpenIDProvider | None:
    """The SSO provider, if ``KILN_OIDC_ISSUER`` and the client credentials are set."""
    s = settings
    if not (s.oidc_issuer and s.oidc_client_id and s.oidc_client_secret):
        return None
    secret = s.oidc_client_secret.get_secret_value()
    return OpenIDProvider(
        s.oidc_issuer, s.oidc_client_id, secret, s.oidc_scopes, s.oidc_label,
        require_verified=s.oidc_require_verified_email,
    )  # fmt: skip


def _multipart_needs_header(app: ASGIApp) -> ASGIApp:
    """Refuse (403) an unsafe multipart request without the CSRF header: looking for the form
    field, the CSRF middleware would read a whole upload before anyone is signed in (htmx sends
    the header; the console has no plain multipart form)."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("method", "GET") not in SAFE_METHODS:  # HTTP only: a websocket has none
            headers = dict(scope["headers"])
            kind = headers.get(b"content-type", b"").partition(b";")[0].strip().lower()
            if kind == b"multipart/form-data" and b"x-csrftoken" not in headers:
                raise PermissionDeniedException("CSRF token verification failed")
        await app(scope, receive, send)

    return middleware


def _derive(secret: bytes, purpose: str) -> bytes:
    return hashlib.sha256(b"kiln-console/" + purpose.encode() + b"\0" + secret).digest()


def console(settings: Settings) -> Console:
    """Build the console for these settings (its keys derive from the server secret)."""
    secret = settings.hmac_key()
    session = CookieBackendConfig(
        secret=_derive(secret, "session"), key="kiln_console", path=PREFIX, max_age=SESSION_S,
        httponly=True, samesite="lax", secure=settings.console_secure_cookies,
    )  # fmt: skip
    csrf = CSRFConfig(
        secret=_derive(secret, "csrf").hex(), cookie_name="kiln_csrf", cookie_path=PREFIX,
        cookie_samesite="lax", cookie_secure=settings.console_secure_cookies,
        cookie_httponly=True, header_name="x-csrftoken",
    )  # fmt: skip
    provider = _provider(settings)
    throttle = SignInThrottle(settings.console_login_failures)
    static = create_static_files_router(path="/static", directories=[HERE / "static"],
                                        name="console-static", include_in_schema=False,
                                        opt=auth.PUBLIC)  # fmt: skip
    router = Router(
        path=PREFIX,
        route_handlers=[
            auth.SignIn,
            pages.Pages,
            overview.Overview,
            members.Members,
            adapters.Adapters,
            costs.Costs,
            finance.Finance,
            models.Models,
            audit.Audit,
            slos.Slos,
            webhooks.Webhooks,
            logs.Logs,
            static,
        ],
        dependencies={
            "viewer": Provide(auth.provide_viewer),
            "provider": Provide(lambda: provider, sync_to_thread=False),
            "throttle": Provide(lambda: throttle, sync_to_thread=False),
            "csrf": Provide(lambda: csrf, sync_to_thread=False),
        },
        middleware=[
            DefineMiddleware(_sessions, config=session),
            DefineMiddleware(_multipart_needs_header),
            DefineMiddleware(SessionCSRFMiddleware, config=csrf),
        ],
        guards=[auth.authorize],
        exception_handlers=errors.HANDLERS,
        include_in_schema=False,
    )
    templates = TemplateConfig(directory=HERE / "templates", engine=JinjaTemplateEngine)
    return Console(router, templates)
