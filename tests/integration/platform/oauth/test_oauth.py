"""OAuth2 client credentials end to end in one process: authlib's own httpx client gets an
RFC 9068 JWT, the gateway accepts it without a database lookup, introspection and revocation
behave per RFC 7662 / 7009, and forged, expired or misdirected tokens are refused."""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from authlib.integrations.httpx_client import AsyncOAuth2Client
from cryptography.exceptions import InvalidTag
from joserfc import jwt
from joserfc.jwk import RSAKey
from sqlalchemy import select, text

from kiln_platform.db.tables import AuditRecord
from kiln_platform.oauth import keys, services
from tests.factories import CLI

from .conftest import BASE, App

Bearer = Callable[[str], dict[str, Any]]


def _part(token: str, i: int) -> dict[str, Any]:
    raw = token.split(".")[i]
    return dict(json.loads(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4))))


async def _fetch(app: App, cid: str, secret: str, method: str = "client_secret_basic",
                 **kw: Any) -> dict[str, Any]:  # fmt: skip
    async with AsyncOAuth2Client(
        cid, secret, token_endpoint_auth_method=method, transport=app.oauth_transport, base_url=BASE
    ) as client:
        token = await client.fetch_token(f"{BASE}/oauth/token", grant_type="client_credentials",
                                         **kw)  # fmt: skip
    return dict(token)


async def test_token_accepted_then_revoked(app: App, bearer: Bearer) -> None:
    tenant = await app.tenant()
    cid, secret = await app.oauth_client(tenant)
    token = await _fetch(app, cid, secret)
    access = token["access_token"]
    assert token["token_type"].lower() == "bearer"
    assert token["expires_in"] == 900
    header, claims = _part(access, 0), _part(access, 1)
    assert header["typ"] == "at+jwt"
    assert header["alg"] == "RS256"
    assert claims["sub"] == claims["client_id"] == cid
    assert claims["tenant"] == str(tenant)
    assert claims["scope"] == "inference"
    assert claims["iss"] == app.kiln.settings.oauth_issuer
    assert claims["aud"] == app.kiln.settings.oauth_audience
    assert claims["exp"] - claims["iat"] == 900
    assert claims["jti"]
    async with app.client() as http:
        jwks = (await http.get("/.well-known/jwks.json")).json()
        assert header["kid"] in [k["kid"] for k in jwks["keys"]]
        assert all("d" not in k for k in jwks["keys"])  # public halves only
        assert (await http.get("/v1/models", headers=bearer(access))).status_code == 200
        r = await http.get("/admin/v1/tenants", headers=bearer(access))
        assert r.status_code == 403  # an inference-only client
        r = await http.post("/oauth/introspect", data={"token": access}, auth=(cid, secret))
        assert r.json()["active"] is True
        assert r.json()["tenant"] == str(tenant)
        r = await http.post("/oauth/revoke", data={"token": access}, auth=(cid, secret))
        assert r.status_code == 200
        r = await http.get("/v1/models", headers=bearer(access))
        assert r.status_code == 401  # key_cache_ttl_s = 0 here; the e2e test checks 5 s
        r = await http.post("/oauth/introspect", data={"token": access}, auth=(cid, secret))
        assert r.json() == {"active": False}
    async with app.kiln.db.sessions() as session:
        actions = list(
            await session.scalars(select(AuditRecord.action).where(AuditRecord.tenant_id == tenant))
        )
    assert sorted(actions) == ["oauth_client.create", "oauth_token.revoke", "tenant.create"]


async def test_client_authentication_and_scopes(app: App) -> None:
    tenant = await app.tenant()
    cid, secret = await app.oauth_client(tenant, "inference", "admin:read")
    token = await _fetch(app, cid, secret, method="client_secret_post", scope="inference")
    assert _part(token["access_token"], 1)["scope"] == "inference"
    token = await _fetch(app, cid, secret)
    assert _part(token["access_token"], 1)["scope"] == "admin:read inference"
    async with app.client() as http:
        form = {"grant_type": "client_credentials"}
        r = await http.post("/oauth/token", data=form, auth=(cid, "wrong"))
        assert r.status_code == 401
        assert r.json()["error"] == "invalid_client"
        r = await http.post("/oauth/token", data=form, auth=("kiln-client-nobody", secret))
        assert r.status_code == 401
        r = await http.post("/oauth/token", data={**form, "scope": "admin:write"},
                            auth=(cid, secret))  # fmt: skip
        assert r.status_code == 400
        assert r.json()["error"] == "invalid_scope"
        r = await http.post("/oauth/token", data={"grant_type": "password"}, auth=(cid, secret))
        assert r.json()["error"] == "unsupported_grant_type"


async def test_admin_scoped_token_is_confined_to_its_tenant(app: App, bearer: Bearer) -> None:
    tenant, other = await app.tenant(), await app.tenant()
    cid, secret = await app.oauth_client(tenant, "admin:read")
    access = (await _fetch(app, cid, secret))["access_token"]
    async with app.client() as http:
        r = await http.get("/admin/v1/tenants", headers=bearer(access))
        assert r.status_code == 200
        assert [t["id"] for t in r.json()] == [str(tenant)]
        r = await http.get(f"/admin/v1/tenants/{other}", headers=bearer(access))
        assert r.status_code == 404
        r = await http.get("/v1/models", headers=bearer(access))
        assert r.status_code == 403  # no inference scope


async def test_introspection_is_per_tenant(app: App) -> None:
    tenant, other = await app.tenant(), await app.tenant()
    cid, secret = await app.oauth_client(tenant)
    sibling = await app.oauth_client(tenant)
    stranger = await app.oauth_client(other)
    access = (await _fetch(app, cid, secret))["access_token"]
    async with app.client() as http:
        r = await http.post("/oauth/introspect", data={"token": access}, auth=sibling)
        assert r.json()["active"] is True
        r = await http.post("/oauth/introspect", data={"token": access}, auth=stranger)
        assert r.json() == {"active": False}
        r = await http.post("/oauth/introspect", data={"token": "nonsense"}, auth=(cid, secret))
        assert r.json() == {"active": False}
        r = await http.post("/oauth/introspect", data={"token": access})
        assert r.status_code == 401  # the caller must authenticate
        r = await http.post("/oauth/revoke", data={"token": access}, auth=stranger)
        assert r.status_code == 400  # not the stranger's token to revoke
        r = await http.post("/oauth/introspect", data={"token": access}, auth=(cid, secret))
        assert r.json()["active"] is True


@pytest.mark.parametrize("case", ["unknown key", "expired", "wrong audience", "wrong issuer",
                                  "not at+jwt", "tampered"])  # fmt: skip
async def test_bad_tokens_are_401(app: App, bearer: Bearer, case: str) -> None:
    tenant = await app.tenant()
    cid, _ = await app.oauth_client(tenant)
    key = await app.kiln.tokens.keyring.signing_key()
    s = app.kiln.settings
    now = int(time.time())
    claims = {
        "iss": s.oauth_issuer, "aud": s.oauth_audience, "sub": cid, "client_id": cid,
        "tenant": str(tenant), "scope": "inference", "jti": uuid.uuid4().hex,
        "iat": now, "exp": now + 600,
    }  # fmt: skip
    header = {"alg": "RS256", "typ": "at+jwt", "kid": key.kid}
    assert (await _get_models(app, bearer, jwt.encode(header, claims, key))) == 200  # the control
    if case == "unknown key":
        key = RSAKey.generate_key(2048, parameters={"kid": "stranger"}, private=True)
        header["kid"] = "stranger"
    elif case == "expired":
        claims.update(iat=now - 1000, exp=now - 100)
    elif case == "wrong audience":
        claims["aud"] = "https://elsewhere.example"
    elif case == "wrong issuer":
        claims["iss"] = "https://elsewhere.example"
    elif case == "not at+jwt":
        header["typ"] = "JWT"
    token = jwt.encode(header, claims, key)
    if case == "tampered":
        head, _, sig = token.split(".")
        forged = {**_part(token, 1), "tenant": str(uuid.uuid4())}
        raw = base64.urlsafe_b64encode(json.dumps(forged).encode()).rstrip(b"=").decode()
        token = f"{head}.{raw}.{sig}"
    assert (await _get_models(app, bearer, token)) == 401


async def _get_models(app: App, bearer: Bearer, token: str) -> int:
    async with app.client() as http:
        return (await http.get("/v1/models", headers=bearer(token))).status_code


async def test_key_rotation_keeps_old_tokens_valid(app: App, bearer: Bearer) -> None:
    tenant = await app.tenant()
    cid, secret = await app.oauth_client(tenant)
    old = (await _fetch(app, cid, secret))["access_token"]
    async with app.kiln.db.sessions.begin() as session:
        kid = await services.rotate_keys(session, CLI, app.kiln.settings.hmac_key())
    new = (await _fetch(app, cid, secret))["access_token"]
    assert _part(new, 0)["kid"] == kid != _part(old, 0)["kid"]
    async with app.client() as http:
        kids = [k["kid"] for k in (await http.get("/.well-known/jwks.json")).json()["keys"]]
        assert {kid, _part(old, 0)["kid"]} <= set(kids)
        for token in (old, new):
            assert (await http.get("/v1/models", headers=bearer(token))).status_code == 200


async def test_signing_keys_sealed_at_rest(app: App, bearer: Bearer) -> None:
    """The table holds no private key material, only a blob the server secret opens; tokens
    signed with the opened key verify."""
    tenant = await app.tenant()
    cid, secret = await app.oauth_client(tenant)
    token = (await _fetch(app, cid, secret))["access_token"]
    assert (await _get_models(app, bearer, token)) == 200
    async with app.kiln.db.sessions() as session:
        rows = (await session.execute(text("SELECT * FROM oauth_signing_keys"))).mappings().all()
    assert rows
    assert set(rows[0]) == {"kid", "private_sealed", "created_at", "retired_at"}
    seal = keys.key_seal(app.kiln.settings.hmac_key())
    for row in rows:
        raw = b"".join(str(v).encode() if not isinstance(v, bytes) else v for v in row.values())
        pem = seal.open(row["private_sealed"], row["kid"].encode())
        private = RSAKey.import_key(pem)
        d = private.as_dict(private=True)["d"]
        assert isinstance(d, str)
        assert b"PRIVATE KEY" in pem
        assert b"PRIVATE KEY" not in raw
        assert b"-----BEGIN" not in raw
        assert pem[40:80] not in raw
        assert base64.urlsafe_b64decode(d + "=" * (-len(d) % 4)) not in raw
        with pytest.raises(InvalidTag):  # another secret, or the blob moved to another kid
            keys.key_seal(b"another secret").open(row["private_sealed"], row["kid"].encode())
        with pytest.raises(InvalidTag):
            seal.open(row["private_sealed"], b"another-kid")
    assert _part(token, 0)["kid"] in {r["kid"] for r in rows}
