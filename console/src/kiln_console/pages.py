"""Tenants, API keys and OAuth clients: thin handlers over their contexts' services, which check
the role and the tenant exactly as they do for ``/admin/v1`` (another tenant's page is a 404)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from litestar import Controller, get, post
from litestar.response import Redirect, Template

from kiln_console import forms
from kiln_console.auth import SIGNED_IN, AnyRequest, KilnDep, Viewer, ViewerDep
from kiln_platform.admin.deps import transaction
from kiln_platform.errors import BadRequest
from kiln_platform.keys import services as api_keys
from kiln_platform.keys import usage
from kiln_platform.keys.schemas import KeyCreate, KeyRotate
from kiln_platform.oauth import services as oauth
from kiln_platform.oauth.schemas import ClientCreate
from kiln_platform.tenants import services as tenants

if TYPE_CHECKING:
    from litestar.datastructures import FormMultiDict
    from sqlalchemy.ext.asyncio import AsyncSession


def _fields(form: FormMultiDict) -> dict[str, Any]:
    """The label and scopes both create forms have (at least one scope ticked)."""
    scopes = form.getall("scopes") if "scopes" in form else []
    if not scopes:
        raise BadRequest("Choose at least one scope.", param="scopes")
    return {"name": str(form.get("name", "")), "scopes": scopes}


TENANTS = {"resource": "tenants"}
KEYS = {"resource": "keys"}
CLIENTS = {"resource": "oauth-clients"}


class Pages(Controller):
    """The console's pages and the partials their forms swap in."""

    @get("/", opt=SIGNED_IN)
    async def home(self, viewer: ViewerDep) -> Redirect:
        """The signed-in user's landing page."""
        return Redirect(viewer.home(), status_code=303)

    @get("/tenants", opt=TENANTS)
    async def tenants(self, kiln: KilnDep, viewer: ViewerDep) -> Template:
        """Tenants the user may see."""
        async with transaction(kiln, viewer.actor) as session:
            rows = await tenants.list_tenants(session, viewer.actor)
        return Template("tenants.html.j2", context={"viewer": viewer, "tenants": rows})

    @get("/tenants/{tenant_id:uuid}/keys", opt=KEYS)
    async def keys(self, kiln: KilnDep, viewer: ViewerDep, tenant_id: uuid.UUID) -> Template:
        """A tenant's API keys, and the form that creates one."""
        async with transaction(kiln, viewer.actor) as session:
            context = await _keys(session, viewer, tenant_id)
        return Template("keys.html.j2", context=context)

    @post("/tenants/{tenant_id:uuid}/keys", opt=KEYS)
    async def create_key(
        self, request: AnyRequest, kiln: KilnDep, viewer: ViewerDep, tenant_id: uuid.UUID
    ) -> Template:
        """Create a key: its secret is shown in this response only."""
        form = await request.form()
        expires = forms.days(str(form.get("expires_days", "")), "expires_days")
        data = forms.convert({**_fields(form), "expires_in_s": expires}, KeyCreate)
        async with transaction(kiln, viewer.actor) as session:
            made = await api_keys.create_key(
                session, viewer.actor, tenant_id, data, kiln.settings.hmac_key()
            )
            context = {**await _keys(session, viewer, tenant_id), "created": made}
        return Template("_key_created.html.j2", context=context, status_code=201)

    @post("/tenants/{tenant_id:uuid}/keys/{key_id:uuid}/revoke", opt=KEYS)
    async def revoke_key(
        self, kiln: KilnDep, viewer: ViewerDep, tenant_id: uuid.UUID, key_id: uuid.UUID
    ) -> Template:
        """Revoke a key; gateways refuse it within the key cache TTL."""
        async with transaction(kiln, viewer.actor) as session:
            await api_keys.revoke_key(
                session,
                viewer.actor,
                str(key_id),
                kiln.settings.hmac_key(),
                tenant_id,
                verifier=kiln.keys,
            )
            context = {**await _keys(session, viewer, tenant_id), "partial": True}
        return Template("_keys.html.j2", context=context)

    @post("/tenants/{tenant_id:uuid}/keys/{key_id:uuid}/rotate", opt=KEYS)
    async def rotate_key(
        self, request: AnyRequest, kiln: KilnDep, viewer: ViewerDep, tenant_id: uuid.UUID,
        key_id: uuid.UUID,
    ) -> Template:  # fmt: skip
        """Rotate a key: the new secret is shown once; the old key works for the chosen overlap."""
        form = await request.form()
        overlap = int(forms.number(str(form.get("overlap_s", "")), "overlap_s"))
        data = forms.convert({"overlap_s": overlap}, KeyRotate)
        async with transaction(kiln, viewer.actor) as session:
            made = await api_keys.rotate_key(
                session,
                viewer.actor,
                tenant_id,
                key_id,
                overlap_s=data.overlap_s,
                hmac_key=kiln.settings.hmac_key(),
                verifier=kiln.keys,
            )
            context = {**await _keys(session, viewer, tenant_id), "created": made}
        return Template("_key_created.html.j2", context=context, status_code=201)

    @get("/tenants/{tenant_id:uuid}/clients", opt=CLIENTS)
    async def clients(self, kiln: KilnDep, viewer: ViewerDep, tenant_id: uuid.UUID) -> Template:
        """A tenant's OAuth clients, and the form that registers one."""
        async with transaction(kiln, viewer.actor) as session:
            context = await _clients(session, viewer, tenant_id)
        return Template("clients.html.j2", context=context)

    @post("/tenants/{tenant_id:uuid}/clients", opt=CLIENTS)
    async def create_client(
        self, request: AnyRequest, kiln: KilnDep, viewer: ViewerDep, tenant_id: uuid.UUID
    ) -> Template:
        """Register a client: its secret is shown in this response only."""
        data = forms.convert(_fields(await request.form()), ClientCreate)
        async with transaction(kiln, viewer.actor) as session:
            made = await oauth.create_client(
                session, viewer.actor, tenant_id, data, kiln.settings.hmac_key()
            )
            context = {**await _clients(session, viewer, tenant_id), "created": made}
        return Template("_client_created.html.j2", context=context, status_code=201)

    @post("/tenants/{tenant_id:uuid}/clients/{client_id:uuid}/revoke", opt=CLIENTS)
    async def revoke_client(
        self, kiln: KilnDep, viewer: ViewerDep, tenant_id: uuid.UUID, client_id: uuid.UUID
    ) -> Template:
        """Revoke a client: no new tokens; its tokens are refused within the cache TTL."""
        async with transaction(kiln, viewer.actor) as session:
            await oauth.revoke_client(session, viewer.actor, tenant_id, client_id)
            context = {**await _clients(session, viewer, tenant_id), "partial": True}
        return Template("_clients.html.j2", context=context)


async def _keys(session: AsyncSession, viewer: Viewer, tenant_id: uuid.UUID) -> dict[str, Any]:
    """The keys page's context, read in the caller's transaction (after its change, if any)."""
    tenant = await tenants.get_tenant(session, viewer.actor, tenant_id)
    rows = await api_keys.list_keys(session, viewer.actor, tenant_id, revoked=True)
    daily = await usage.daily_requests(session, [k.id for k in rows])
    now = datetime.now(UTC)
    return {"viewer": viewer, "tenant": tenant, "keys": rows, "usage": daily, "now": now,
            "soon": now + timedelta(days=7)}  # fmt: skip


async def _clients(session: AsyncSession, viewer: Viewer, tenant_id: uuid.UUID) -> dict[str, Any]:
    """The OAuth clients page's context, read in the caller's transaction."""
    tenant = await tenants.get_tenant(session, viewer.actor, tenant_id)
    clients = await oauth.list_clients(session, viewer.actor, tenant_id)
    ids = [c.id for c in clients]
    daily = await usage.daily_requests(session, ids, client=True)
    return {"viewer": viewer, "tenant": tenant, "clients": clients, "usage": daily,
            "last_used": await usage.last_used(session, ids)}  # fmt: skip
