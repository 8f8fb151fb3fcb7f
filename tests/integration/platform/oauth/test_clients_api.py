"""``/admin/v1/tenants/{id}/oauth-clients``: list, create (secret once), revoke — and a revoked
client's outstanding tokens are refused by the gateway, not only its new token requests."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from sqlalchemy import select

from kiln_platform.db.tables import AuditRecord, OAuthClient

from .conftest import App

Bearer = Callable[[str], dict[str, Any]]
FORM = {"grant_type": "client_credentials"}


async def _token(app: App, cid: str, secret: str) -> str:
    async with app.client() as http:
        r = await http.post("/oauth/token", data=FORM, auth=(cid, secret))
    assert r.status_code == 200, r.text
    return str(r.json()["access_token"])


async def test_create_list_revoke(app: App, bearer: Bearer) -> None:
    tenant = await app.tenant()
    admin = await _token(app, *await app.oauth_client(tenant, "admin:write"))
    path = f"/admin/v1/tenants/{tenant}/oauth-clients"
    async with app.client() as http:
        r = await http.post(path, json={"name": "batch jobs", "scopes": ["inference"]},
                            headers=bearer(admin))  # fmt: skip
        assert r.status_code == 201, r.text
        made = r.json()
        cid, secret = made["client"]["client_id"], made["client_secret"]
        listed = (await http.get(path, headers=bearer(admin))).json()
        assert [c["name"] for c in listed] == ["batch jobs", "test"]
        assert all("secret" not in str(c) for c in listed)  # shown once, at creation
        access = await _token(app, cid, secret)
        assert (await http.get("/v1/models", headers=bearer(access))).status_code == 200

        r = await http.delete(f"{path}/{made['client']['id']}", headers=bearer(admin))
        assert r.status_code == 200
        revoked_at = r.json()["revoked_at"]
        assert revoked_at is not None
        r = await http.get("/v1/models", headers=bearer(access))
        assert r.status_code == 401  # key_cache_ttl_s = 0 here
        assert "revoked" in r.json()["error"]["message"]
        r = await http.post("/oauth/token", data=FORM, auth=(cid, secret))
        assert r.status_code == 401
        again = await http.delete(f"{path}/{made['client']['id']}", headers=bearer(admin))
        assert again.json()["revoked_at"] == revoked_at  # idempotent: audited once
    async with app.kiln.db.sessions() as session:
        actions = list(
            await session.scalars(
                select(AuditRecord.action).where(
                    AuditRecord.tenant_id == tenant, AuditRecord.action.like("oauth_client.%")
                )
            )
        )
    assert sorted(actions) == ["oauth_client.create", "oauth_client.create", "oauth_client.revoke"]


async def test_other_tenants_and_members(app: App, bearer: Bearer) -> None:
    tenant, other = await app.tenant(), await app.tenant()
    admin = await _token(app, *await app.oauth_client(tenant, "admin:write"))
    member = await _token(app, *await app.oauth_client(tenant, "inference"))
    theirs, _ = await app.oauth_client(other)
    async with app.client() as http:
        r = await http.get(f"/admin/v1/tenants/{other}/oauth-clients", headers=bearer(admin))
        assert r.status_code == 404
        listed = (await http.get(f"/admin/v1/tenants/{other}/oauth-clients",
                                 headers=bearer(member))).status_code  # fmt: skip
        assert listed == 403  # an inference-only credential has no admin scope
        async with app.kiln.db.sessions() as session:
            row = await session.scalar(select(OAuthClient).where(OAuthClient.client_id == theirs))
        assert row is not None
        r = await http.delete(f"/admin/v1/tenants/{tenant}/oauth-clients/{row.id}",
                              headers=bearer(admin))  # fmt: skip
        assert r.status_code == 404  # another tenant's client, addressed through ours
        r = await http.delete(f"/admin/v1/tenants/{tenant}/oauth-clients/{uuid.uuid4()}",
                              headers=bearer(admin))  # fmt: skip
        assert r.status_code == 404
        r = await http.post(f"/admin/v1/tenants/{tenant}/oauth-clients",
                            json={"scopes": ["root"]}, headers=bearer(admin))  # fmt: skip
        assert r.status_code == 400
        assert "scopes" in r.json()["detail"]
