"""Tenancy fixtures: the real app on a fresh database, a platform-admin key, and a client that
remembers every successful admin mutation so the audit log can be checked against it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from pydantic import SecretStr
from sqlalchemy import func, select

from kiln_console.compose import create_app
from kiln_platform.context import Kiln
from kiln_platform.db.tables import AuditRecord
from kiln_platform.settings import Settings
from tests.asgi import asgi
from tests.factories import make_root_key

from ..conftest import serving

MUTATIONS = {"POST", "PUT", "PATCH", "DELETE"}


@dataclass
class Admin:
    """An HTTP client for the app that records the request id of each admin mutation."""

    client: httpx.AsyncClient
    kiln: Kiln
    mutations: list[str] = field(default_factory=list)

    async def call(self, method: str, path: str, token: str, **kw: Any) -> httpx.Response:
        headers = {"authorization": f"Bearer {token}", **kw.pop("headers", {})}
        resp = await self.client.request(method, path, headers=headers, **kw)
        if method in MUTATIONS and path.startswith("/admin/v1") and resp.status_code < 300:
            self.mutations.append(resp.headers["x-request-id"])
        return resp

    async def tenant(self, token: str, name: str) -> str:
        r = await self.call("POST", "/admin/v1/tenants", token, json={"name": name})
        assert r.status_code == 201, r.text
        return str(r.json()["id"])

    async def key(self, token: str, tenant: str, **body: Any) -> str:
        r = await self.call("POST", f"/admin/v1/tenants/{tenant}/keys", token, json=body)
        assert r.status_code == 201, r.text
        return str(r.json()["secret"])


@pytest.fixture(scope="module")
def settings(database_uri: str, tmp_path_factory: pytest.TempPathFactory) -> Settings:
    return Settings(
        data_dir=tmp_path_factory.mktemp("data"), database_url=database_uri,
        secret_key=SecretStr("tenancy-test-secret"), key_cache_ttl_s=0.0,
    )  # fmt: skip


@pytest.fixture(scope="module")
async def admin(settings: Settings) -> AsyncIterator[Admin]:
    app = create_app(settings)
    transport = httpx.ASGITransport(app=asgi(app), client=("10.1.2.3", 4321))
    async with (
        serving(app),
        httpx.AsyncClient(transport=transport, base_url="http://kiln.test") as client,
    ):
        harness = Admin(client, app.state.kiln)
        yield harness
        await _every_mutation_audited_once(harness)


async def _every_mutation_audited_once(admin: Admin) -> None:
    async with admin.kiln.db.sessions() as session:
        rows = await session.execute(
            select(AuditRecord.request_id, func.count())
            .where(AuditRecord.request_id.is_not(None))
            .group_by(AuditRecord.request_id)
        )
        counts = dict(rows.tuples().all())
    assert admin.mutations, "no admin mutation was made"
    assert {rid: counts.get(rid, 0) for rid in admin.mutations} == dict.fromkeys(admin.mutations, 1)
    assert set(counts) <= set(admin.mutations), "audit records without a mutation"


@pytest.fixture(scope="module")
async def root(admin: Admin) -> str:
    """A platform-admin key, made the way ``kiln`` does (CLI actor)."""
    async with admin.kiln.db.sessions.begin() as session:
        made = await make_root_key(session, admin.kiln.settings.hmac_key())
    return made.secret
