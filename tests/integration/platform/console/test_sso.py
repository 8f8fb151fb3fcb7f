"""Console single sign-on against a real OpenID Connect provider on loopback
(``tests/fixtures/oidc_provider.py``): the code flow with PKCE signs in an existing user, and
every way an answer can be wrong — state, audience, nonce, issuer, expiry, signature, an
unverified or unknown email — is refused without a session."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from pydantic import SecretStr
from sqlalchemy import select

from kiln_platform.db.tables import AuditRecord, User
from kiln_platform.settings import Settings

from .conftest import App

HX = {"hx-request": "true"}


@pytest.fixture(scope="module")
def settings(
    database_uri: str, tmp_path_factory: pytest.TempPathFactory, oidc_provider: Any
) -> Settings:
    return Settings(
        data_dir=tmp_path_factory.mktemp("data"), database_url=database_uri,
        secret_key=SecretStr("console-test-secret"), oidc_issuer=oidc_provider.base_url,
        oidc_client_id="kiln-console", oidc_client_secret=SecretStr("idp-secret"),
    )  # fmt: skip


async def _sso(http: httpx.AsyncClient) -> httpx.Response:
    """Start at /console/sso, let the provider answer, and return Kiln's callback response."""
    start = await http.get("/console/sso")
    assert start.status_code == 303, start.text
    async with httpx.AsyncClient() as browser:  # the provider is a real server
        back = await browser.get(start.headers["location"])
    assert back.status_code in (302, 303), back.text
    return await http.get(back.headers["location"].removeprefix("http://127.0.0.1"))


async def test_a_verified_email_of_a_user_signs_in(app: App, oidc_provider: Any) -> None:
    tenant = await app.tenant()
    oidc_provider.email, oidc_provider.tamper = await app.user("tenant-admin", tenant), None
    async with app.client() as http:
        page = await http.get("/console/login")
        assert 'href="/console/sso"' in page.text
        r = await _sso(http)
        assert (r.status_code, r.headers["location"]) == (303, "/console/")
        r = await http.get(f"/console/tenants/{tenant}/keys")
        assert r.status_code == 200
        assert oidc_provider.email in r.text
    async with app.kiln.db.sessions() as session:
        after = await session.scalar(
            select(AuditRecord.after).where(
                AuditRecord.tenant_id == tenant, AuditRecord.action == "user.login"
            )
        )
    assert after == {"method": "oidc"}


@pytest.mark.parametrize(
    ("tamper", "status", "says"),
    [
        ("aud", 401, "not valid"),
        ("nonce", 401, "not valid"),
        ("expired", 401, "not valid"),
        ("issuer", 401, "not valid"),
        ("signature", 401, "not valid"),
        ("unverified", 403, "did not vouch"),
        ("unstated", 403, "did not vouch"),  # KILN_OIDC_REQUIRE_VERIFIED_EMAIL, the default
    ],
)
async def test_a_wrong_id_token_is_refused(
    app: App, oidc_provider: Any, tamper: str, status: int, says: str
) -> None:
    tenant = await app.tenant()
    oidc_provider.email, oidc_provider.tamper = await app.user("tenant-admin", tenant), tamper
    try:
        async with app.client() as http:
            r = await _sso(http)
            assert r.status_code == status, r.text
            assert says in r.text
            r = await http.get(f"/console/tenants/{tenant}/keys")
            assert (r.status_code, r.headers["location"]) == (303, "/console/login")
    finally:
        oidc_provider.tamper = None


async def test_unknown_emails_and_forged_states_get_no_session(
    app: App, oidc_provider: Any
) -> None:
    oidc_provider.email, oidc_provider.tamper = "stranger@example.com", None
    async with app.client() as http:
        r = await _sso(http)
        assert r.status_code == 403
        assert "No console account has the email stranger@example.com" in r.text
        r = await http.get("/console/sso/callback?code=abc&state=forged")
        assert r.status_code == 401
        assert "did not start here" in r.text
        assert (await http.get("/console/tenants")).status_code == 303


async def test_the_first_sign_in_binds_the_user_to_the_providers_subject(
    app: App, oidc_provider: Any
) -> None:
    tenant = await app.tenant()
    email = await app.user("tenant-admin", tenant)
    page = f"/console/tenants/{tenant}/keys"
    oidc_provider.email, oidc_provider.subject, oidc_provider.tamper = email, "sub-alice", None
    try:
        async with app.client() as http:
            assert (await _sso(http)).status_code == 303  # binds (iss, sub-alice)
        async with app.kiln.db.sessions() as session:
            bound = (await session.execute(
                select(User.oidc_issuer, User.oidc_subject).where(User.email == email)
            )).one()  # fmt: skip
        assert tuple(bound) == (oidc_provider.base_url, "sub-alice")
        # someone else took over the address at the provider: same email, another subject
        oidc_provider.subject = "sub-mallory"
        async with app.client() as http:
            r = await _sso(http)
            assert r.status_code == 403
            assert "bound to another single sign-on identity" in r.text
            assert (await http.get(page)).status_code == 303  # no session
        # the bound subject changed its email at the provider: still the same console user
        oidc_provider.email, oidc_provider.subject = "alice.new@example.com", "sub-alice"
        async with app.client() as http:
            assert (await _sso(http)).status_code == 303
            r = await http.get(page)
            assert r.status_code == 200
            assert email in r.text
    finally:
        oidc_provider.subject = None
