"""The console's users and quotas pages: tenant-admins add, re-role and remove their tenant's
users (tenant roles only); everyone in the tenant but finance reads its quotas and budget."""

from __future__ import annotations

import uuid

from sqlalchemy import select, text

from kiln_platform.db.tables import User

from .conftest import PASSWORD, App

HX = {"hx-request": "true"}


async def _id(app: App, email: str) -> uuid.UUID:
    async with app.kiln.db.sessions() as session:
        found = await session.scalar(select(User.id).where(User.email == email))
    assert found is not None
    return found


async def test_a_tenant_admin_manages_its_users(app: App) -> None:
    tenant, other = await app.tenant(), await app.tenant()
    async with app.signed_in(await app.user("tenant-admin", tenant)) as (http, token):
        headers = {**HX, "x-csrftoken": token}
        base = f"/console/tenants/{tenant}/users"
        new = f"dev-{uuid.uuid4().hex[:6]}@example.com"
        form = {"email": new, "password": PASSWORD, "role": "tenant-member"}
        r = await http.post(base, data=form, headers=headers)
        assert r.status_code == 201, r.text
        assert new in r.text
        user = await _id(app, new)
        r = await http.post(f"{base}/{user}/role", data={"role": "tenant-admin"}, headers=headers)
        assert r.status_code == 200
        async with app.kiln.db.sessions() as session:
            assert await session.scalar(select(User.role).where(User.id == user)) == "tenant-admin"
        for bad, field in (({**form, "email": "x@example.com", "role": "platform-admin"}, None),
                           ({**form, "email": "y@example.com", "password": "short"}, "password"),
                           ({**form, "email": "not-an-email"}, "email")):  # fmt: skip
            r = await http.post(base, data=bad, headers=headers)
            assert r.status_code in (400, 403), (bad, r.text)
            if field:
                assert f'data-field="{field}"' in r.text
        stranger = await app.user("tenant-member", other)
        r = await http.post(f"{base}/{await _id(app, stranger)}/remove", headers=headers)
        assert r.status_code == 404  # another tenant's user, addressed through ours
        r = await http.post(f"{base}/{user}/remove", headers=headers)
        assert r.status_code == 200
        assert new not in r.text
        assert (await http.get(f"/console/tenants/{other}/users")).status_code == 404


async def test_quotas_and_budget_are_shown_to_the_tenant(app: App) -> None:
    tenant = await app.tenant()
    async with app.kiln.db.sessions.begin() as session:
        await session.execute(
            text("INSERT INTO quotas (id, tenant_id, rpm, monthly_budget_micros, "
                 "batch_tokens_per_day) VALUES (:i, :t, 120, 25000000, 2000000)"),
            {"i": uuid.uuid4(), "t": tenant},
        )  # fmt: skip
    async with app.signed_in(await app.user("tenant-member", tenant)) as (http, _):
        page = await http.get(f"/console/tenants/{tenant}/quotas")
        assert page.status_code == 200
        assert ">120<" in page.text
        assert "25.000000" in page.text  # the budget, and all of it left
        assert 'id="left">25.000000' in page.text
        assert 'id="batch-tokens-per-day">2,000,000<' in page.text
        assert 'id="batch-enqueued-tokens">none<' in page.text
        assert (await http.get(f"/console/tenants/{tenant}/users")).status_code == 403
    async with app.signed_in(await app.user("finance")) as (http, _):
        assert (await http.get(f"/console/tenants/{tenant}/quotas")).status_code == 403


async def test_the_audit_log_shows_the_tenants_own_records(app: App) -> None:
    ours, theirs = await app.tenant(), await app.tenant()
    async with app.signed_in(await app.user("tenant-admin", theirs)) as (http, token):
        form = {"name": "theirs", "scopes": "inference"}
        await http.post(f"/console/tenants/{theirs}/keys", data=form,
                        headers={**HX, "x-csrftoken": token})  # fmt: skip
    admin = await app.user("tenant-admin", ours)
    async with app.signed_in(admin) as (http, token):
        r = await http.post(f"/console/tenants/{ours}/keys", data={"scopes": "inference"},
                            headers={**HX, "x-csrftoken": token})  # fmt: skip
        assert r.status_code == 201
        page = await http.get("/console/audit")
        assert page.status_code == 200
        assert f"user:{admin}" in page.text
        assert page.text.count('data-action="key.create"') == 1  # ours, not theirs
        r = await http.get("/console/audit?action=user.login", headers=HX)
        assert 'data-action="user.login"' in r.text
        assert 'data-action="key.create"' not in r.text
    async with app.signed_in(await app.user("tenant-member", ours)) as (http, _):
        assert (await http.get("/console/audit")).status_code == 403
