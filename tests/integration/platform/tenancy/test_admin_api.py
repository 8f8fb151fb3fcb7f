"""The admin API: tenants, keys, users, roles, and the isolation matrix between tenants."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from .conftest import Admin

ID = str(uuid.uuid4())


async def test_tenant_and_key_lifecycle(admin: Admin, root: str) -> None:
    tenant = await admin.tenant(root, "lifecycle")
    r = await admin.call(
        "POST",
        f"/admin/v1/tenants/{tenant}/keys",
        root,
        json={"name": "ci", "scopes": ["inference"], "expires_in_s": 3600},
    )
    assert r.status_code == 201, r.text
    created = r.json()
    secret, key = created["secret"], created["key"]
    assert secret.startswith(key["prefix"] + "_")
    listed = (await admin.call("GET", f"/admin/v1/tenants/{tenant}/keys", root)).json()
    assert [k["prefix"] for k in listed] == [key["prefix"]]
    assert set(listed[0]) >= {
        "prefix",
        "name",
        "created_at",
        "last_used_at",
        "expires_at",
        "scopes",
        "role",
    }
    assert secret not in str(listed)
    r = await admin.client.get("/v1/models", headers={"authorization": f"Bearer {secret}"})
    assert r.status_code == 200
    listed = (await admin.call("GET", f"/admin/v1/tenants/{tenant}/keys", root)).json()
    assert listed[0]["last_used_at"] is not None
    r = await admin.call("DELETE", f"/admin/v1/tenants/{tenant}/keys/{key['id']}", root)
    assert r.status_code == 200
    assert r.json()["revoked_at"] is not None
    r = await admin.client.get("/v1/models", headers={"authorization": f"Bearer {secret}"})
    assert r.status_code == 401
    r = await admin.call("PATCH", f"/admin/v1/tenants/{tenant}", root, json={"weight": 2.5})
    assert r.json()["weight"] == 2.5
    assert (await admin.call("DELETE", f"/admin/v1/tenants/{tenant}", root)).status_code == 204
    assert (await admin.call("GET", f"/admin/v1/tenants/{tenant}", root)).status_code == 404


async def test_the_key_list_pages_newest_first_and_leaves_revoked_keys_out(
    admin: Admin, root: str
) -> None:
    tenant = await admin.tenant(root, "key-pages")
    url = f"/admin/v1/tenants/{tenant}/keys"
    made = [(await admin.call("POST", url, root, json={"name": f"k{i}"})).json()["key"]
            for i in range(4)]  # fmt: skip
    assert (await admin.call("DELETE", f"{url}/{made[1]['id']}", root)).status_code == 200

    async def names(query: str) -> list[str]:
        r = await admin.call("GET", f"{url}?{query}", root)
        assert r.status_code == 200, r.text
        return [k["name"] for k in r.json()]

    assert await names("") == ["k3", "k2", "k0"]
    assert await names("revoked=true") == ["k3", "k2", "k1", "k0"]
    assert await names("limit=2") == ["k3", "k2"]
    assert await names(f"limit=2&before={made[2]['id']}") == ["k0"]
    assert await names(f"revoked=true&before={made[2]['id']}") == ["k1", "k0"]
    other = await admin.tenant(root, "key-pages-other")
    theirs = (await admin.call("POST", f"/admin/v1/tenants/{other}/keys", root, json={})).json()
    assert await names(f"before={theirs['key']['id']}") == []
    for bad in ("limit=0", "limit=201", "before=nope"):
        r = await admin.call("GET", f"{url}?{bad}", root)
        assert r.status_code == 400, bad
        assert bad.split("=")[0] in r.text, r.text


async def test_scopes_and_roles(admin: Admin, root: str) -> None:
    tenant = await admin.tenant(root, "scopes")
    inference = await admin.key(root, tenant)
    reader = await admin.key(root, tenant, scopes=["admin:read"])
    r = await admin.call("GET", "/admin/v1/tenants", inference)
    assert r.status_code == 403
    assert r.headers["content-type"].startswith("application/problem+json")
    assert (await admin.call("GET", f"/admin/v1/tenants/{tenant}/keys", reader)).status_code == 200
    r = await admin.call("POST", f"/admin/v1/tenants/{tenant}/keys", reader, json={})
    assert r.status_code == 403
    writer = await admin.key(root, tenant, scopes=["admin:write"])
    assert (
        await admin.call("POST", "/admin/v1/tenants", writer, json={"name": "x"})
    ).status_code == 403
    r = await admin.call(
        "POST",
        f"/admin/v1/tenants/{tenant}/keys",
        writer,
        json={"role": "platform-admin", "scopes": ["admin:write"]},
    )
    assert r.status_code == 403  # a tenant-admin cannot mint a platform-admin key
    assert (await admin.call("GET", "/admin/v1/tenants", "nope")).status_code == 401


async def test_users_and_roles(admin: Admin, root: str) -> None:
    tenant = await admin.tenant(root, "users-co")
    body = {
        "email": "Ann@users.co",
        "password": "correct horse",
        "role": "tenant-member",
        "tenant_id": tenant,
    }
    r = await admin.call("POST", "/admin/v1/users", root, json=body)
    assert r.status_code == 201, r.text
    user = r.json()
    assert user["email"] == "ann@users.co"
    assert "password" not in str(user)
    assert (await admin.call("POST", "/admin/v1/users", root, json=body)).status_code == 409
    r = await admin.call(
        "PATCH", f"/admin/v1/users/{user['id']}", root, json={"role": "tenant-admin"}
    )
    assert r.json()["role"] == "tenant-admin"
    r = await admin.call(
        "POST", "/admin/v1/users", root, json={**body, "email": "b@users.co", "tenant_id": None}
    )
    assert r.status_code == 400
    async with admin.kiln.db.sessions() as session:
        stored = await session.scalar(
            text("SELECT password_hash FROM users WHERE id = :i"), {"i": user["id"]}
        )
    assert stored.startswith("$argon2id$")
    assert (await admin.call("DELETE", f"/admin/v1/users/{user['id']}", root)).status_code == 204


async def test_isolation_matrix(admin: Admin, root: str) -> None:
    """A tenant-admin of A gets 404 for every one of B's objects, with nothing leaked."""
    a, b = await admin.tenant(root, "iso-a"), await admin.tenant(root, "iso-b")
    a_admin = await admin.key(root, a, scopes=["admin:read", "admin:write"])
    b_key = (await admin.call("POST", f"/admin/v1/tenants/{b}/keys", root, json={})).json()["key"]
    r = await admin.call("POST", "/admin/v1/users", root, json={
        "email": "bob@iso-b.co", "password": "secret-pass", "role": "tenant-member",
        "tenant_id": b})  # fmt: skip
    b_user = r.json()["id"]
    probes = [
        ("GET", f"/admin/v1/tenants/{b}", None),
        ("PATCH", f"/admin/v1/tenants/{b}", {"weight": 3}),
        ("DELETE", f"/admin/v1/tenants/{b}", None),
        ("GET", f"/admin/v1/tenants/{b}/keys", None),
        ("POST", f"/admin/v1/tenants/{b}/keys", {}),
        ("DELETE", f"/admin/v1/tenants/{b}/keys/{b_key['id']}", None),
        ("DELETE", f"/admin/v1/tenants/{a}/keys/{b_key['id']}", None),
        ("GET", f"/admin/v1/users/{b_user}", None),
        ("PATCH", f"/admin/v1/users/{b_user}", {"role": "tenant-admin"}),
        ("DELETE", f"/admin/v1/users/{b_user}", None),
        (
            "POST",
            "/admin/v1/users",
            {"email": "eve@x.co", "password": "12345678", "role": "tenant-member", "tenant_id": b},
        ),
        ("GET", f"/admin/v1/quotas/{b}", None),
        ("PUT", f"/admin/v1/quotas/{b}", {"rpm": 1}),
        ("PUT", f"/admin/v1/quotas/{b}/keys/{b_key['id']}", {"rpm": 1}),
    ]
    for method, path, body in probes:
        r = await admin.call(method, path, a_admin, json=body)
        assert r.status_code == 404, (method, path, r.status_code, r.text)
        for secret in (b, b_key["prefix"], "iso-b", "bob@"):
            assert secret not in r.text
    listed = (await admin.call("GET", "/admin/v1/tenants", a_admin)).json()
    assert [t["id"] for t in listed] == [a]
    users = (await admin.call("GET", "/admin/v1/users", a_admin)).json()
    assert all(u["tenant_id"] == a for u in users)
    page = (await admin.call("GET", f"/admin/v1/audit?tenant_id={b}", a_admin)).json()
    assert page["data"] == []
    assert (await admin.call("GET", f"/admin/v1/tenants/{b}", root)).status_code == 200


async def test_audit_log_filters_and_pages(admin: Admin, root: str) -> None:
    tenant = await admin.tenant(root, "audited")
    for _ in range(3):
        await admin.key(root, tenant)
    r = await admin.call(
        "GET", f"/admin/v1/audit?tenant_id={tenant}&action=key.create&limit=2", root
    )
    page = r.json()
    assert len(page["data"]) == 2
    assert page["next_cursor"] is not None
    first = page["data"][0]
    assert first["actor"].startswith("key:kiln_")
    assert first["actor_role"] == "platform-admin"
    assert first["request_id"]
    assert first["source"]
    assert first["after"]["prefix"].startswith("kiln_")
    r = await admin.call(
        "GET",
        f"/admin/v1/audit?tenant_id={tenant}&action=key.create"
        f"&limit=2&cursor={page['next_cursor']}",
        root,
    )
    assert len(r.json()["data"]) == 1
    assert r.json()["next_cursor"] is None
    async with admin.kiln.db.sessions() as session:
        with pytest.raises(DBAPIError, match="append-only"):
            await session.execute(text("DELETE FROM audit_log"))


async def test_an_unknown_path_or_method_is_named_in_the_error(admin: Admin, root: str) -> None:
    r = await admin.call("POST", "/v1/audio/speech", root, json={})
    assert r.status_code == 404
    assert r.json()["error"]["message"] == "Not Found: POST /v1/audio/speech"
    r = await admin.call("DELETE", "/v1/embeddings", root)
    assert (r.status_code, r.json()["error"]["type"]) == (405, "invalid_request_error")
    assert r.json()["error"]["message"] == "Method Not Allowed: DELETE /v1/embeddings"
    r = await admin.call("GET", "/admin/v1/nothing", root)
    assert (r.status_code, r.json()["detail"]) == (404, "Not Found: GET /admin/v1/nothing")
