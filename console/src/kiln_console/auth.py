"""Sign-in with a local account, sign-out, and who a signed-in request acts as.

The session cookie holds the user's id, the user's session version and the session's CSRF
token. Each request reads the user again: a deleted account is signed out at the next click, and
so is every session of a user who signed out, or whose password, role or tenant changed (each
bumps ``users.session_version``, migration 0009).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from litestar import Controller, Request, get, post
from litestar.config.csrf import CSRFConfig
from litestar.connection import ASGIConnection
from litestar.handlers import BaseRouteHandler
from litestar.params import SkipValidation
from litestar.response import Redirect, Template

from kiln_console.csrf import session_token
from kiln_console.forms import convert
from kiln_console.sso import OpenIDProvider
from kiln_platform.admin.authz import (
    BILLING_READERS,
    Actor,
    Role,
    actor_tenant,
    check_tenant,
    require,
)
from kiln_platform.admin.deps import READS, source_of
from kiln_platform.context import Kiln
from kiln_platform.errors import BadRequest, Forbidden, NotFound, Unauthorized
from kiln_platform.users.schemas import Login
from kiln_platform.users.services import (
    authenticate,
    sign_in_verified,
    sign_out_everywhere,
    signed_in_user,
)
from kiln_platform.users.throttle import SignInThrottle

if TYPE_CHECKING:
    from kiln_platform.db.tables import User

AnyRequest = Request[Any, Any, Any]
Connection = ASGIConnection[Any, Any, Any, Any]
KilnDep = SkipValidation[Kiln]
ProviderDep = SkipValidation[OpenIDProvider | None]
"""The single sign-on provider, None without SSO."""
ThrottleDep = SkipValidation[SignInThrottle]
CSRFDep = SkipValidation[CSRFConfig]


class LoginRequired(Exception):
    """No valid session: the console sends the browser to the sign-in page."""


@dataclass(frozen=True)
class Viewer:
    """The signed-in user and the actor the admin services see."""

    actor: Actor
    email: str
    home_tenant: uuid.UUID | None
    """The user's own tenant (None for platform-wide users)."""

    @property
    def role(self) -> Role:
        """The user's role."""
        return self.actor.role

    @property
    def reads_costs(self) -> bool:
        """May open the costs page."""
        return self.role in BILLING_READERS

    def may_change(self, resource: str) -> bool:
        """The role may change ``resource`` (the page shows its forms and buttons)."""
        try:
            require(self.actor, resource, write=True)
        except Forbidden:
            return False
        return True

    def home(self) -> str:
        """Where signing in lands."""
        if self.role is Role.FINANCE or (self.home_tenant is None and not self.actor.is_global):
            return "/console/finance"
        return "/console/overview"


ViewerDep = SkipValidation[Viewer]
"""The signed-in user, the ``viewer`` dependency of every console page."""


async def provide_viewer(request: AnyRequest, kiln: KilnDep) -> Viewer:
    """The signed-in user (re-read from the database), or ``LoginRequired``."""
    return await viewer_of(request, kiln)


async def viewer_of(request: Connection, kiln: Kiln) -> Viewer:
    """The signed-in user, read once a request (``authorize``, then ``provide_viewer``)."""
    known: Viewer | None = request.state.get("viewer")
    if known is not None:
        return known
    uid, version = _signed_in(request)
    if uid is None:
        raise LoginRequired
    user = await signed_in_user(kiln.db.sessions, uid, version)
    if user is None:
        request.clear_session()
        raise LoginRequired
    role = Role(user.role)
    actor = Actor(f"user:{user.email}", role, actor_tenant(role, user.tenant_id),
                  request_id=request.state.get("request_id"),
                  source=source_of(request))  # fmt: skip
    viewer = Viewer(actor, user.email, user.tenant_id)
    request.state.viewer = viewer
    return viewer


PUBLIC = {"public": True}
"""The ``opt`` of a page anyone may open (sign-in, static files)."""
SIGNED_IN = {"resource": None}
"""The ``opt`` of a page any signed-in user may open (the landing redirect)."""


async def authorize(connection: Connection, handler: BaseRouteHandler) -> None:
    """The guard of every console page: signed in (else the sign-in page), the tenant of a
    ``tenant_id`` in the URL visible (else 404), and the page's ``opt["resource"]`` readable
    (GET) or writable (POST) by the user's role (``authz._RULES``, as ``/admin/v1``), before
    any form or upload is read. A page that declares neither a resource nor ``PUBLIC`` is
    refused."""
    if handler.opt.get("public"):
        return
    if "resource" not in handler.opt:
        raise Forbidden("This page declares no resource to authorize.")
    viewer = await viewer_of(connection, connection.app.state.kiln)
    tenant = connection.path_params.get("tenant_id")
    if tenant is not None:
        check_tenant(viewer.actor, tenant, "tenant")
    if (resource := handler.opt["resource"]) is not None:
        require(viewer.actor, resource, write=connection.scope.get("method") not in READS)


def _signed_in(request: Connection) -> tuple[uuid.UUID | None, object]:
    """The session's user id (None: not signed in) and the session version it was given."""
    session = request.session if request.scope.get("session") else {}
    try:
        return uuid.UUID(str(session.get("uid"))), session.get("ver")
    except ValueError:
        return None, None


def _start_session(request: AnyRequest, user: User, csrf: CSRFConfig) -> Redirect:
    """Sign ``user`` in: a session with their session version and a CSRF token of its own."""
    token, cookies = session_token(request, csrf)
    request.set_session({"uid": str(user.id), "ver": user.session_version, "csrf": token})
    return Redirect("/console/", status_code=303, cookies=cookies)


def _login_page(
    provider: OpenIDProvider | None, email: str, error: str | None, *, status: int = 200,
    headers: dict[str, str] | None = None,
) -> Template:  # fmt: skip
    """The sign-in page, with what was typed and why it failed."""
    context = {"email": email, "error": error, "sso": provider and provider.label}
    return Template("login.html.j2", context=context, status_code=status, headers=headers)


def _callback(request: AnyRequest, kiln: Kiln) -> str:
    """The redirect URI registered with the provider: ``KILN_CONSOLE_URL`` or this host's."""
    base = kiln.settings.console_url or str(request.base_url)
    return f"{base.rstrip('/')}/console/sso/callback"


class SignIn(Controller):
    """``/console/login`` and ``/console/logout``."""

    opt = PUBLIC

    @get("/login")
    async def form(self, provider: ProviderDep) -> Template:
        """The sign-in page."""
        return _login_page(provider, "", None)

    @post("/login")
    async def login(
        self, request: AnyRequest, kiln: KilnDep, provider: ProviderDep, throttle: ThrottleDep,
        csrf: CSRFDep,
    ) -> Redirect | Template:  # fmt: skip
        """Check the password (audited as ``user.login``); start a session. The attempt counts
        as a failure before the check; past the limit for the email or the address, 429
        without a check. An over-long email or password is a 400 naming the field."""
        form = await request.form()
        fields = {"email": str(form.get("email", "")).strip(),
                  "password": str(form.get("password", ""))}  # fmt: skip
        try:
            login = convert(fields, Login)
        except BadRequest as exc:
            return _login_page(provider, fields["email"][:320], exc.message, status=400)
        source = str(source_of(request))
        attempt = await throttle.attempt(kiln.db.sessions, login.email, source)
        if attempt.wait > 0:
            wait = attempt.wait
            error = f"Too many failed sign-ins; try again in {max(1, round(wait / 60))} min."
            headers = {"retry-after": str(max(1, round(wait)))}
            return _login_page(provider, login.email, error, status=429, headers=headers)
        try:
            user = await authenticate(kiln.db.sessions, login.email, login.password,
                                      request.state.request_id, source)  # fmt: skip
        except Unauthorized as exc:
            return _login_page(provider, login.email, exc.message, status=401)
        await throttle.succeeded(kiln.db.sessions, login.email, attempt)
        return _start_session(request, user, csrf)

    @get("/sso")
    async def sso_start(
        self, request: AnyRequest, kiln: KilnDep, provider: ProviderDep
    ) -> Redirect:
        """Send the browser to the identity provider (state, nonce and PKCE in the session)."""
        if provider is None:
            raise NotFound("Single sign-on is not configured.")
        await provider.discover()
        url, flow = provider.start(_callback(request, kiln))
        request.set_session({"oidc": flow})
        return Redirect(url, status_code=303)

    @get("/sso/callback")
    async def sso_callback(
        self, request: AnyRequest, kiln: KilnDep, provider: ProviderDep, csrf: CSRFDep
    ) -> Redirect | Template:
        """Finish the sign-in: the user bound to the token's ``(iss, sub)``, or (first time) the
        user with its verified email, starts a session."""
        if provider is None:
            raise NotFound("Single sign-on is not configured.")
        flow = request.session.get("oidc") if request.scope.get("session") else None
        request.clear_session()
        params = {k: str(v) for k, v in request.query_params.items()}
        try:
            identity = await provider.finish(params, flow or {}, _callback(request, kiln))
            async with kiln.db.sessions.begin() as session:
                user = await sign_in_verified(session, identity, request.state.request_id,
                                              source_of(request), "oidc")  # fmt: skip
        except (Unauthorized, Forbidden) as exc:
            return _login_page(provider, "", exc.message, status=exc.status_code)
        return _start_session(request, user, csrf)

    @post("/logout")
    async def logout(self, request: AnyRequest, kiln: KilnDep) -> Redirect:
        """End the session, and every other session of the user (a copied cookie too)."""
        uid, version = _signed_in(request)
        if uid is not None and isinstance(version, int):
            async with kiln.db.sessions.begin() as session:
                await sign_out_everywhere(session, uid, version)
        request.clear_session()
        return Redirect("/console/login", status_code=303)
