"""The console over HTTP: sign-in, sessions, CSRF, roles and tenants, and bad form input —
everything but the browser (tests/e2e/test_console.py drives Chromium through the same pages)."""

from __future__ import annotations

import csv
import io
import uuid
from datetime import UTC, datetime

import httpx
from sqlalchemy import delete, func, select

from kiln_platform.db.tables import ApiKey, AuditRecord, OAuthClient, User
from kiln_platform.reports.schemas import AdjustmentCreate
from kiln_platform.reports.statements import create_adjustment
from tests.factories import CLI

from .conftest import PASSWORD, App, csrf

HX = {"hx-request": "true"}


async def test_sign_in_lands_on_the_roles_home_and_is_audited(app: App) -> None:
    tenant = await app.tenant()
    cases = {
        "tenant-admin": "/console/overview",
        "tenant-member": "/console/overview",
        "platform-admin": "/console/overview",
        "finance": "/console/finance",
    }
    for role, home in cases.items():
        email = await app.user(role, tenant if role.startswith("tenant") else None)
        async with app.signed_in(email) as (http, _):
            r = await http.get("/console/")
            assert (r.status_code, r.headers["location"]) == (303, home), role
            assert (await http.get(home)).status_code == 200, role
    async with app.kiln.db.sessions() as session:
        logins = await session.scalar(
            select(func.count()).select_from(AuditRecord).where(AuditRecord.action == "user.login")
        )
    assert logins == len(cases)


async def test_wrong_password_and_no_session(app: App) -> None:
    email = await app.user("tenant-admin", await app.tenant())
    async with app.client() as http:
        token = csrf(await http.get("/console/login"))
        r = await http.post("/console/login", data={"email": email, "password": "wrong password",
                                                    "_csrf_token": token})  # fmt: skip
        assert r.status_code == 401
        assert "Incorrect email or password." in r.text
        assert "kiln_console" not in r.cookies
        r = await http.get("/console/tenants")
        assert (r.status_code, r.headers["location"]) == (303, "/console/login")
        r = await http.get("/console/tenants", headers=HX)  # htmx: a full-page redirect
        assert (r.status_code, r.headers["hx-redirect"]) == (204, "/console/login")


async def test_unsafe_requests_need_the_csrf_token(app: App) -> None:
    tenant = await app.tenant()
    async with app.signed_in(await app.user("tenant-admin", tenant)) as (http, token):
        form = {"name": "x", "scopes": "inference"}
        r = await http.post(f"/console/tenants/{tenant}/keys", data=form, headers=HX)
        assert r.status_code == 403
        r = await http.post(f"/console/tenants/{tenant}/keys", data=form,
                            headers={**HX, "x-csrftoken": "forged" + token[6:]})  # fmt: skip
        assert r.status_code == 403
        async with app.kiln.db.sessions() as session:
            count = await session.scalar(
                select(func.count()).select_from(ApiKey).where(ApiKey.tenant_id == tenant)
            )
        assert count == 0
        r = await http.post(f"/console/tenants/{tenant}/keys", data=form,
                            headers={**HX, "x-csrftoken": token})  # fmt: skip
        assert r.status_code == 201
        assert 'id="secret-value"' in r.text


async def test_bad_form_input_names_the_field_and_writes_nothing(app: App) -> None:
    tenant = await app.tenant()
    cases = [
        ({"name": "no scopes"}, "scopes"),
        ({"name": "bad", "scopes": "root"}, "scopes"),
        ({"name": "x" * 101, "scopes": "inference"}, "name"),
        ({"name": "soon", "scopes": "inference", "expires_days": "abc"}, "expires_days"),
        ({"name": "late", "scopes": "inference", "expires_days": "4000"}, "expires_days"),
    ]
    async with app.signed_in(await app.user("tenant-admin", tenant)) as (http, token):
        headers = {**HX, "x-csrftoken": token}
        for form, field in cases:
            r = await http.post(f"/console/tenants/{tenant}/keys", data=form, headers=headers)
            assert r.status_code == 400, form
            assert r.headers["hx-retarget"] == "#flash"
            assert f'data-field="{field}"' in r.text, (form, r.text)
            if "expires_days" in form:
                continue  # clients do not expire
            r = await http.post(f"/console/tenants/{tenant}/clients", data=form, headers=headers)
            assert r.status_code == 400, form
            assert f'data-field="{field}"' in r.text, (form, r.text)
    async with app.kiln.db.sessions() as session:
        for table in (ApiKey, OAuthClient):
            count = await session.scalar(
                select(func.count()).select_from(table).where(table.tenant_id == tenant)
            )
            assert count == 0, table


async def test_members_read_and_other_tenants_are_404(app: App) -> None:
    tenant, other = await app.tenant(), await app.tenant()
    async with app.signed_in(await app.user("tenant-member", tenant)) as (http, token):
        headers = {**HX, "x-csrftoken": token}
        page = await http.get(f"/console/tenants/{tenant}/keys")
        assert page.status_code == 200
        assert 'id="new-key"' not in page.text  # no form for a role that may not create
        r = await http.post(f"/console/tenants/{tenant}/keys",
                            data={"scopes": "inference"}, headers=headers)  # fmt: skip
        assert r.status_code == 403
        for path in (f"/console/tenants/{other}/keys", f"/console/tenants/{other}/clients",
                     f"/console/tenants/{uuid.uuid4()}/keys"):  # fmt: skip
            assert (await http.get(path)).status_code == 404, path
        r = await http.get("/console/costs")
        assert r.status_code == 403  # members read no costs


async def test_a_deleted_user_is_signed_out_at_the_next_click(app: App) -> None:
    tenant = await app.tenant()
    email = await app.user("tenant-admin", tenant)
    async with app.signed_in(email) as (http, _):
        assert (await http.get(f"/console/tenants/{tenant}/keys")).status_code == 200
        async with app.kiln.db.sessions.begin() as session:
            await session.execute(delete(User).where(User.email == email))
        r = await http.get(f"/console/tenants/{tenant}/keys")
        assert (r.status_code, r.headers["location"]) == (303, "/console/login")


async def test_sign_out_ends_the_session(app: App) -> None:
    tenant = await app.tenant()
    async with app.signed_in(await app.user("tenant-admin", tenant)) as (http, token):
        r = await http.post("/console/logout", data={"_csrf_token": token})
        assert (r.status_code, r.headers["location"]) == (303, "/console/login")
        r = await http.get(f"/console/tenants/{tenant}/keys")
        assert (r.status_code, r.headers["location"]) == (303, "/console/login")


async def test_costs_are_confined_to_the_tenant_and_bad_dates_name_the_field(app: App) -> None:
    ours, theirs = await app.tenant(), await app.tenant()
    period = datetime.now(UTC).strftime("%Y-%m")
    async with app.kiln.db.sessions.begin() as session:
        for tenant, amount in ((ours, 1_000_000), (theirs, 7_000_000)):
            data = AdjustmentCreate(amount_micros=amount, reason="test", corrects_period=period)
            await create_adjustment(session, CLI, tenant, data)
    async with app.signed_in(await app.user("tenant-admin", ours)) as (http, _):
        page = await http.get("/console/costs")
        assert page.status_code == 200
        assert "1.000000" in page.text
        assert "7.000000" not in page.text  # another tenant's charge
        r = await http.get("/console/costs.csv")
        lines = list(csv.DictReader(io.StringIO(r.text)))
        assert [line["BillingAccountId"] for line in lines] == [str(ours)]
        r = await http.get("/console/costs?from=yesterday", headers=HX)
        assert r.status_code == 400
        assert 'data-field="from"' in r.text
    async with app.signed_in(await app.user("finance")) as (http, _):
        r = await http.get("/console/costs.csv")
        ids = {line["BillingAccountId"] for line in csv.DictReader(io.StringIO(r.text))}
        assert {str(ours), str(theirs)} <= ids  # finance reads every tenant
        r = await http.get(f"/console/tenants/{ours}/keys")
        assert r.status_code == 403  # and nothing else


async def test_repeated_failures_lock_the_email_for_a_while(app: App) -> None:
    locked = await app.user("tenant-admin", await app.tenant())
    other = await app.user("tenant-admin", await app.tenant())
    async with app.client() as http:
        token = csrf(await http.get("/console/login"))

        async def attempt(email: str, password: str) -> httpx.Response:
            form = {"email": email, "password": password, "_csrf_token": token}
            return await http.post("/console/login", data=form)

        for _ in range(5):  # KILN_CONSOLE_LOGIN_FAILURES
            assert (await attempt(locked, "guess")).status_code == 401
        r = await attempt(locked.upper(), PASSWORD)  # even the right password, any case
        assert r.status_code == 429
        assert 800 < int(r.headers["retry-after"]) <= 900
        assert "Too many failed sign-ins" in r.text
        assert (await attempt(other, PASSWORD)).status_code == 303  # another email still can
