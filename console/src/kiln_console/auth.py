"""Sign-in with a local account, sign-out, and who a signed-in request acts as.

The session cookie holds only the user's id. Each request reads the user again, so a deleted
account or a changed role takes effect at the next click, not when the cookie expires.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from litestar import Controller, Request, get, post
from litestar.connection import ASGIConnection
from litestar.handlers import BaseRouteHandler
from litestar.params import SkipValidation
from litestar.response import Redirect, Template

from kiln_console.sso import OpenIDProvider
from kiln_console.throttle import SignInThrottle
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
from kiln_platform.db.tables import User
from kiln_platform.errors import Forbidden, NotFound, Unauthorized
from kiln_platform.users.services import authenticate, sign_in_verified

AnyRequest = Request[Any, Any, Any]
Connection = ASGIConnection[Any, Any, Any, Any]
KilnDep = SkipValidation[Kiln]
ProviderDep = SkipValidation[OpenIDProvider | None]
"""The single sign-on provider, None without SSO."""
ThrottleDep = SkipValidation[SignInThrottle]


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
        if self.role is Role.PLATFORM_ADMIN:
            return "/console/tenants"
        if self.role is Role.FINANCE or self.home_tenant is None:
            return "/console/costs"
        return f"/console/tenants/{self.home_tenant}/keys"


async def provide_viewer(request: AnyRequest, kiln: KilnDep) -> Viewer:
    """The signed-in user (re-read from the database), or ``LoginRequired``."""
    return await viewer_of(request, kiln)


async def viewer_of(request: Connection, kiln: Kiln) -> Viewer:
    """The signed-in user, read once a request (``authorize``, then ``provide_viewer``)."""
    known: Viewer | None = request.state.get("viewer")
    if known is not None:
        return known
    raw = request.session.get("uid") if request.scope.get("session") else None
    try:
        uid = uuid.UUID(str(raw))
    except ValueError:
        raise LoginRequired from None
    async with kiln.db.sessions() as session:
        user = await session.get(User, uid)
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
        self, request: AnyRequest, kiln: KilnDep, provider: ProviderDep, throttle: ThrottleDep
    ) -> Redirect | Template:
        """Check the password (audited as ``user.login``); start a session. Repeated failures
        for one email or from one address are refused for a while (429) before any check."""
        form = await request.form()
        email, password = str(form.get("email", "")).strip(), str(form.get("password", ""))
        source = str(source_of(request))
        wait = await throttle.retry_after(kiln.db.sessions, email, source)
        if wait > 0:
            error = f"Too many failed sign-ins; try again in {max(1, round(wait / 60))} min."
            headers = {"retry-after": str(max(1, round(wait)))}
            return _login_page(provider, email, error, status=429, headers=headers)
        try:
            async with kiln.db.sessions.begin() as session:
                user = await authenticate(session, email, password, request.state.request_id,
                                          source)  # fmt: skip
        except Unauthorized as exc:
            await throttle.failed(kiln.db.sessions, email, source)
            return _login_page(provider, email, exc.message, status=401)
        await throttle.succeeded(kiln.db.sessions, email)
        request.set_session({"uid": str(user.id)})
        return Redirect("/console/", status_code=303)

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
        self, request: AnyRequest, kiln: KilnDep, provider: ProviderDep
    ) -> Redirect | Template:
        """Finish the sign-in: a verified email of an existing user starts a session."""
        if provider is None:
            raise NotFound("Single sign-on is not configured.")
        flow = request.session.get("oidc") if request.scope.get("session") else None
        request.clear_session()
        params = {k: str(v) for k, v in request.query_params.items()}
        try:
            email = await provider.finish(params, flow or {}, _callback(request, kiln))
            async with kiln.db.sessions.begin() as session:
                user = await sign_in_verified(session, email, request.state.request_id,
                                              source_of(request), "oidc")  # fmt: skip
        except (Unauthorized, Forbidden) as exc:
            return _login_page(provider, "", exc.message, status=exc.status_code)
        request.set_session({"uid": str(user.id)})
        return Redirect("/console/", status_code=303)

    @post("/logout")
    async def logout(self, request: AnyRequest) -> Redirect:
        """End the session."""
        request.clear_session()
        return Redirect("/console/login", status_code=303)
