"""Model writes are platform-admin only: a tenant-admin credential (any scopes) gets 403 on every
one with nothing stored, and an upload is refused before its body is read."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from sqlalchemy import func, select

from kiln_platform.db.tables import AuditRecord, CompileJob, Model, ModelRoute, ModelVersion
from kiln_platform.oauth import services as oauth
from kiln_platform.oauth.schemas import ClientCreate
from tests.factories import CLI

from .conftest import Admin

FULL = ["admin:read", "admin:write", "inference"]
CHUNK = 256 << 10


class CountingBody:
    """A request body that records how many bytes the server pulled from it."""

    def __init__(self, size: int, head: bytes = b"") -> None:
        self.size, self.head, self.pulled = size, head, 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self.head:
            self.pulled += len(self.head)
            yield self.head
        sent = 0
        while sent < self.size:
            chunk = b"\0" * min(CHUNK, self.size - sent)
            sent += len(chunk)
            self.pulled += len(chunk)
            yield chunk


async def _state(admin: Admin) -> dict[str, Any]:
    """Everything a model write could change: rows, audit records, stored files."""
    async with admin.kiln.db.sessions() as session:
        counts: dict[str, Any] = {
            table.__name__: await session.scalar(select(func.count()).select_from(table))
            for table in (Model, ModelVersion, CompileJob, ModelRoute, AuditRecord)
        }
    store = admin.kiln.settings.store_dir
    counts["files"] = sorted(str(p) for p in store.rglob("*")) if store.exists() else []
    return counts


async def _upload(admin: Admin, token: str, name: str, body: bytes) -> str:
    r = await admin.call("POST", f"/admin/v1/models/{name}/versions", token, content=body)
    assert r.status_code == 201, r.text
    return str(r.json()["version"])


async def test_a_tenant_admin_key_gets_403_on_every_model_write_with_nothing_stored(
    admin: Admin, root: str, tensor_models: dict[str, Path]
) -> None:
    mlp = tensor_models["mlp"].read_bytes()
    version = await _upload(admin, root, "shared-mlp", mlp)
    async with admin.kiln.db.sessions() as session:
        audited = await session.scalar(
            select(func.count()).select_from(AuditRecord)
            .where(AuditRecord.action == "model.version.create")
        )  # fmt: skip
    assert audited == 1  # the platform-admin's upload is in the audit log
    tenant = await admin.tenant(root, f"t-{uuid.uuid4().hex[:6]}")
    key = await admin.key(root, tenant, scopes=FULL)  # tenant-admin: the default with admin scopes
    async with admin.kiln.db.sessions.begin() as session:
        made = await oauth.create_client(
            session, CLI, uuid.UUID(tenant), ClientCreate(name="c", scopes=FULL),  # type: ignore[arg-type]
            admin.kiln.settings.hmac_key(),
        )  # fmt: skip
    form = {"grant_type": "client_credentials"}
    credentials = (made.client.client_id, made.client_secret)
    # authlib accepts plain http only on loopback
    r = await admin.client.post("http://127.0.0.1/oauth/token", data=form, auth=credentials)
    assert r.status_code == 200, r.text
    token = str(r.json()["access_token"])
    writes: list[tuple[str, str, dict[str, Any]]] = [
        ("POST", "/admin/v1/models/shared-mlp/versions", {"content": mlp}),
        ("POST", "/admin/v1/models/shared-mlp/versions?version=9", {"content": mlp}),
        ("POST", "/admin/v1/models/brand-new/versions", {"content": mlp}),
        ("POST", f"/admin/v1/models/shared-mlp/versions/{version}/compile",
         {"json": {"target": "cpu", "precision": "int8"}}),
        ("PUT", "/admin/v1/models/shared-mlp/route", {"json": {"stable_version": version}}),
        ("PUT", "/admin/v1/models/shared-mlp/route",
         {"json": {"stable_version": version, "canary_version": None, "canary_percent": 0}}),
    ]  # fmt: skip
    before = await _state(admin)
    answers = []
    for credential in (key, token):
        for method, path, body in writes:
            r = await admin.call(method, path, credential, **body)
            answers.append((method, path, r.status_code))
    assert [status for *_, status in answers] == [403] * len(answers), answers
    # ... and the compile jobs (their reports, the hardware) are not theirs to read either.
    assert (await admin.call("GET", "/admin/v1/compile-jobs", key)).status_code == 403
    assert await _state(admin) == before
    print(f"tenant-admin model writes refused: {len(answers)} (key and OAuth token)")


async def test_an_upload_is_refused_before_its_body_is_read(admin: Admin, root: str) -> None:
    tenant = await admin.tenant(root, f"t-{uuid.uuid4().hex[:6]}")
    key = await admin.key(root, tenant, scopes=FULL)
    member = await admin.key(root, tenant, scopes=["admin:read"], role="tenant-member")
    size = 32 * CHUNK  # 8 MiB
    boundary = "kilnboundary"
    part = (f'--{boundary}\r\nContent-Disposition: form-data; name="weights"; '
            f'filename="adapter_model.safetensors"\r\n\r\n').encode()  # fmt: skip
    multipart = {"content-type": f"multipart/form-data; boundary={boundary}"}
    cases: list[tuple[str, str | None, dict[str, str], int, bytes]] = [
        ("/admin/v1/models/m/versions", key, {}, 403, b""),
        ("/admin/v1/models/m/versions", key, {"idempotency-key": "k1"}, 403, b""),
        ("/admin/v1/models/m/versions", None, {}, 401, b""),
        (f"/admin/v1/tenants/{tenant}/adapters", member, multipart, 403, part),
        (f"/admin/v1/tenants/{tenant}/adapters", None, multipart, 401, part),
        (f"/admin/v1/tenants/{uuid.uuid4()}/adapters", key, multipart, 404, part),
        ("/admin/v1/models/m/versions?version=no%2Fslash", root, {}, 400, b""),
        ("/admin/v1/models/No%20Caps/versions", root, {}, 400, b""),
    ]
    for path, credential, headers, status, head in cases:
        body = CountingBody(size, head)
        auth = {"authorization": f"Bearer {credential}"} if credential else {}
        r = await admin.client.post(path, content=body, headers={**auth, **headers})
        assert (r.status_code, body.pulled) == (status, 0), (path, headers, r.text)
    # The measure works: an authorized upload is read (to its end: 8 MiB of zeros is no model).
    body = CountingBody(size)
    r = await admin.client.post("/admin/v1/models/m/versions", content=body,
                                headers={"authorization": f"Bearer {root}"})  # fmt: skip
    assert (r.status_code, body.pulled) == (400, size), r.text
