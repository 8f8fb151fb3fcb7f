"""Sign-in with a local account, sign-out, and who a signed-in request acts as.

The session cookie holds only the user's id. Each request reads the user again, so a deleted
account or a changed role takes effect at the next click, not when the cookie expires.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from litestar import Controller, Request, get, post
from litestar.params import SkipValidation
from litestar.response import Redirect, Template

from kiln_platform.admin.authz import BILLING_READERS, Actor, Role, actor_tenant, require
from kiln_platform.admin.deps import source_of
from kiln_platform.context import Kiln
from kiln_platform.db.tables import User
from kiln_platform.errors import Forbidden, Unauthorized
from kiln_platform.users.services import authenticate

AnyRequest = Request[Any, Any, Any]
KilnDep = SkipValidation[Kiln]


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
                  request_id=request.state.request_id, source=source_of(request))  # fmt: skip
    return Viewer(actor, user.email, user.tenant_id)


class SignIn(Controller):
    """``/console/login`` and ``/console/logout``."""

    @get("/login")
    async def form(self) -> Template:
        """The sign-in page."""
        return Template("login.html.j2", context={"email": "", "error": None})

    @post("/login")
    async def login(self, request: AnyRequest, kiln: KilnDep) -> Redirect | Template:
        """Check the password (audited as ``user.login``); start a session."""
        form = await request.form()
        email, password = str(form.get("email", "")), str(form.get("password", ""))
        try:
            async with kiln.db.sessions.begin() as session:
                user = await authenticate(session, email, password, request.state.request_id,
                                          source_of(request))  # fmt: skip
        except Unauthorized as exc:
            context = {"email": email, "error": exc.message}
            return Template("login.html.j2", context=context, status_code=401)
        request.set_session({"uid": str(user.id)})
        return Redirect("/console/", status_code=303)

    @post("/logout")
    async def logout(self, request: AnyRequest) -> Redirect:
        """End the session."""
        request.clear_session()
        return Redirect("/console/login", status_code=303)
