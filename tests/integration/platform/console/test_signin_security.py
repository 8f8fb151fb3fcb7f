"""Console sign-in under attack: parallel guesses get at most the limit of password checks,
over-long fields are a 400 naming them, sessions end everywhere on sign-out or a password or
role change, and a CSRF token works only in the session it was issued to."""

from __future__ import annotations

import asyncio

import httpx
from prometheus_client import REGISTRY
from sqlalchemy import update

from kiln_platform.db.tables import User

from .conftest import App, csrf

HX = {"hx-request": "true"}


def _checks() -> float:
    return REGISTRY.get_sample_value("kiln_console_password_checks_total") or 0.0


async def test_200_parallel_guesses_get_at_most_the_limit_of_checks(app: App) -> None:
    email = await app.user("tenant-admin", await app.tenant())
    async with app.client() as http:
        token = csrf(await http.get("/console/login"))
        before = _checks()
        form = {"email": email, "password": "wrong guess", "_csrf_token": token}
        replies = await asyncio.gather(
            *(http.post("/console/login", data=form) for _ in range(200))
        )
    statuses = [r.status_code for r in replies]
    assert _checks() - before == 5  # KILN_CONSOLE_LOGIN_FAILURES: five reached argon2
    assert statuses.count(401) == 5
    assert statuses.count(429) == 195


async def test_over_long_fields_are_a_400_naming_them(app: App) -> None:
    async with app.client() as http:
        token = csrf(await http.get("/console/login"))
        before = _checks()
        form = {"email": "a" * 488 + "@example.com", "password": "x", "_csrf_token": token}
        r = await http.post("/console/login", data=form)
        assert r.status_code == 400
        assert "$.email" in r.text
        form = {"email": "someone@example.com", "password": "p" * 5000, "_csrf_token": token}
        r = await http.post("/console/login", data=form)
        assert r.status_code == 400
        assert "$.password" in r.text
    assert _checks() == before  # no hash was computed for either


async def test_sign_out_ends_every_session_of_the_user(app: App) -> None:
    tenant = await app.tenant()
    email = await app.user("tenant-admin", tenant)
    page = f"/console/tenants/{tenant}/keys"
    async with app.signed_in(email) as (first, token), app.signed_in(email) as (second, _):
        copied = httpx.AsyncClient(transport=app.transport, base_url="http://127.0.0.1",
                                   cookies=first.cookies)  # fmt: skip
        async with copied:
            assert (await copied.get(page)).status_code == 200
            r = await first.post("/console/logout", data={"_csrf_token": token})
            assert (r.status_code, r.headers["location"]) == (303, "/console/login")
            for browser in (copied, second):  # a copied cookie and the other browser
                r = await browser.get(page)
                assert (r.status_code, r.headers["location"]) == (303, "/console/login")
    async with app.signed_in(email) as (third, _):  # signing in again works
        assert (await third.get(page)).status_code == 200


async def test_a_password_or_role_change_ends_sessions(app: App) -> None:
    tenant = await app.tenant()
    page = f"/console/tenants/{tenant}/keys"
    for change in ({"password_hash": "$argon2id$changed"}, {"role": "tenant-member"}):
        email = await app.user("tenant-admin", tenant)
        async with app.signed_in(email) as (http, _):
            assert (await http.get(page)).status_code == 200
            async with app.kiln.db.sessions.begin() as session:
                await session.execute(update(User).where(User.email == email).values(**change))
            r = await http.get(page)
            assert (r.status_code, r.headers["location"]) == (303, "/console/login"), change


async def test_a_csrf_token_works_only_in_its_own_session(app: App) -> None:
    tenant = await app.tenant()
    admin = await app.user("tenant-admin", tenant)
    path = f"/console/tenants/{tenant}/keys"
    async with app.client() as http:
        before_sign_in = csrf(await http.get("/console/login"))
    async with app.signed_in(admin) as (mine, my_token), app.signed_in(admin) as (_, theirs):
        assert my_token != before_sign_in
        for token in (theirs, before_sign_in):  # another session's; this browser's old one
            # the double-submit check alone would pass: cookie and header carry the same token
            mine.cookies.set("kiln_csrf", token, path="/console")
            r = await mine.post(path, data={"name": "k"}, headers={**HX, "x-csrftoken": token})
            assert r.status_code == 403, token
            assert "another site" in r.text
        mine.cookies.set("kiln_csrf", my_token, path="/console")
        r = await mine.post(path, data={"name": "k"}, headers={**HX, "x-csrftoken": my_token})
        assert (r.status_code, 'data-field="scopes"' in r.text) == (400, True)  # past CSRF
