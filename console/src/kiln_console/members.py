"""A tenant's users (invite, change role, remove) and its quotas and budget this month: thin
handlers over the users and quotas services (tenant-admins grant tenant roles only, in their
tenant)."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from litestar import Controller, get, post
from litestar.response import Template

from kiln_console import forms
from kiln_console.auth import AnyRequest, KilnDep, Viewer, ViewerDep
from kiln_platform.admin.deps import transaction
from kiln_platform.errors import NotFound
from kiln_platform.quotas.services import get_quotas
from kiln_platform.reports.formats import money
from kiln_platform.tenants.services import get_tenant
from kiln_platform.users import services as users
from kiln_platform.users.schemas import UserCreate, UserUpdate

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession


class Members(Controller):
    """``/console/tenants/{id}/users`` and ``/console/tenants/{id}/quotas``."""

    opt = {"resource": "users"}  # noqa: RUF012 (auth.authorize reads it)

    @get("/tenants/{tenant_id:uuid}/users")
    async def users(self, kiln: KilnDep, viewer: ViewerDep, tenant_id: uuid.UUID) -> Template:
        """The tenant's console users, and the form that adds one."""
        async with transaction(kiln, viewer.actor) as session:
            context = await _users(session, viewer, tenant_id)
        return Template("users.html.j2", context=context)

    @post("/tenants/{tenant_id:uuid}/users")
    async def add_user(
        self, request: AnyRequest, kiln: KilnDep, viewer: ViewerDep, tenant_id: uuid.UUID
    ) -> Template:
        """Add a user with a first password (they sign in with it, or with SSO)."""
        form = await request.form()
        fields = {"email": str(form.get("email", "")), "password": str(form.get("password", "")),
                  "role": str(form.get("role", "")), "tenant_id": str(tenant_id)}  # fmt: skip
        data = forms.convert(fields, UserCreate)
        async with transaction(kiln, viewer.actor) as session:
            await users.create_user(session, viewer.actor, data)
            context = {**await _users(session, viewer, tenant_id), "partial": True}
        return Template("_users.html.j2", context=context, status_code=201)

    @post("/tenants/{tenant_id:uuid}/users/{user_id:uuid}/role")
    async def set_role(
        self, request: AnyRequest, kiln: KilnDep, viewer: ViewerDep, tenant_id: uuid.UUID,
        user_id: uuid.UUID,
    ) -> Template:  # fmt: skip
        """Change a user's role."""
        data = forms.convert({"role": str((await request.form()).get("role", ""))}, UserUpdate)
        async with transaction(kiln, viewer.actor) as session:
            await _same_tenant(session, viewer, user_id, tenant_id)
            await users.change_role(session, viewer.actor, user_id, data)
            context = {**await _users(session, viewer, tenant_id), "partial": True}
        return Template("_users.html.j2", context=context)

    @post("/tenants/{tenant_id:uuid}/users/{user_id:uuid}/remove")
    async def remove(
        self, kiln: KilnDep, viewer: ViewerDep, tenant_id: uuid.UUID, user_id: uuid.UUID
    ) -> Template:
        """Remove a user (their session ends at their next click)."""
        async with transaction(kiln, viewer.actor) as session:
            await _same_tenant(session, viewer, user_id, tenant_id)
            await users.delete_user(session, viewer.actor, user_id)
            context = {**await _users(session, viewer, tenant_id), "partial": True}
        return Template("_users.html.j2", context=context)

    @get("/tenants/{tenant_id:uuid}/quotas", opt={"resource": "quotas"})
    async def quotas(self, kiln: KilnDep, viewer: ViewerDep, tenant_id: uuid.UUID) -> Template:
        """The tenant's limits and this month's budget: spent, held, left, thresholds reached."""
        async with transaction(kiln, viewer.actor) as session:
            tenant = await get_tenant(session, viewer.actor, tenant_id)
            view = await get_quotas(session, viewer.actor, tenant_id)
        context = {"viewer": viewer, "tenant": tenant, "quotas": view, "money": money}
        return Template("quotas.html.j2", context=context)


async def _users(session: AsyncSession, viewer: Viewer, tenant_id: uuid.UUID) -> dict[str, Any]:
    """The users page's context, read in the caller's transaction (after its change, if any)."""
    tenant = await get_tenant(session, viewer.actor, tenant_id)
    rows = await users.list_users(session, viewer.actor, tenant_id)
    return {"viewer": viewer, "tenant": tenant, "users": rows}


async def _same_tenant(
    session: AsyncSession, viewer: Viewer, user_id: uuid.UUID, tenant_id: uuid.UUID
) -> None:
    """The user must belong to the tenant in the URL (a platform-admin could name any user)."""
    if (await users.get_user(session, viewer.actor, user_id)).tenant_id != tenant_id:
        raise NotFound("No such user.")
