"""The Idempotency-Key middleware in the real app on a real PostgreSQL: admin POSTs replayed
without running twice, mismatches, key length, running duplicates, unauthenticated calls and
outcomes that are not stored."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from pydantic import SecretStr
from sqlalchemy import func, select

from kiln_console.compose import create_app
from kiln_platform.billing.tables import IdempotencyKey
from kiln_platform.context import Kiln
from kiln_platform.db.tables import AuditRecord, Tenant
from kiln_platform.idempotency.services import KeyScope
from kiln_platform.settings import Settings
from tests.asgi import asgi
from tests.factories import make_root_key

from ..conftest import serving


@pytest.fixture(scope="module")
async def app_client(
    database_uri: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[httpx.AsyncClient, Kiln]]:
    settings = Settings(
        data_dir=tmp_path_factory.mktemp("data"), database_url=database_uri,
        secret_key=SecretStr("idempotency-test-secret"), key_cache_ttl_s=0.0,
    )  # fmt: skip
    app = create_app(settings)
    transport = httpx.ASGITransport(app=asgi(app))
    async with (
        serving(app),
        httpx.AsyncClient(transport=transport, base_url="http://kiln.test") as client,
    ):
        yield client, app.state.kiln


@pytest.fixture(scope="module")
async def root(app_client: tuple[httpx.AsyncClient, Kiln]) -> tuple[str, uuid.UUID]:
    """A platform-admin key and its id."""
    kiln = app_client[1]
    async with kiln.db.sessions.begin() as session:
        made = await make_root_key(session, kiln.settings.hmac_key(), tenant="operators")
    return made.secret, made.key.id


async def _post(
    client: httpx.AsyncClient, path: str, token: str, body: dict[str, Any], key: str | None
) -> httpx.Response:
    headers = {"authorization": f"Bearer {token}"}
    if key is not None:
        headers["idempotency-key"] = key
    return await client.post(path, content=json.dumps(body).encode(), headers=headers)


async def _count(kiln: Kiln, *where: Any, table: Any = Tenant) -> int:
    async with kiln.db.sessions() as session:
        return int(await session.scalar(select(func.count()).select_from(table).where(*where)) or 0)


async def test_admin_post_is_replayed_not_run_twice(
    app_client: tuple[httpx.AsyncClient, Kiln], root: tuple[str, uuid.UUID]
) -> None:
    client, kiln = app_client
    body, key = {"name": "replayed-co"}, str(uuid.uuid4())
    first = await _post(client, "/admin/v1/tenants", root[0], body, key)
    again = await _post(client, "/admin/v1/tenants", root[0], body, key)
    assert first.status_code == again.status_code == 201
    assert again.content == first.content
    assert again.headers["idempotent-replayed"] == "true"
    assert "idempotent-replayed" not in first.headers
    assert again.headers.get_list("x-request-id") == [first.headers["x-request-id"]]
    assert again.headers["content-type"] == first.headers["content-type"]
    assert await _count(kiln, Tenant.name == "replayed-co") == 1
    created = AuditRecord.target_id == first.json()["id"]
    assert await _count(kiln, created, table=AuditRecord) == 1


async def test_changed_body_is_422_naming_the_header(
    app_client: tuple[httpx.AsyncClient, Kiln], root: tuple[str, uuid.UUID]
) -> None:
    client, kiln = app_client
    key = str(uuid.uuid4())
    assert (await _post(client, "/admin/v1/tenants", root[0], {"name": "a-co"}, key)).is_success
    changed = await _post(client, "/admin/v1/tenants", root[0], {"name": "b-co"}, key)
    assert changed.status_code == 422
    assert changed.headers["content-type"].startswith("application/problem+json")
    assert "Idempotency-Key" in changed.json()["detail"]
    assert changed.json()["title"] == "idempotency_key_reused"
    assert await _count(kiln, Tenant.name == "b-co") == 0


async def test_v1_errors_keep_the_openai_shape(
    app_client: tuple[httpx.AsyncClient, Kiln], root: tuple[str, uuid.UUID]
) -> None:
    client, _ = app_client
    body, key = {"model": "nope", "input": "x"}, str(uuid.uuid4())
    first = await _post(client, "/v1/embeddings", root[0], body, key)
    assert first.status_code == 404  # a completed answer: stored, like Stripe's
    again = await _post(client, "/v1/embeddings", root[0], body, key)
    assert (again.status_code, again.content) == (404, first.content)
    assert again.headers["idempotent-replayed"] == "true"
    changed = await _post(client, "/v1/embeddings", root[0], {**body, "input": "y"}, key)
    assert changed.status_code == 422
    assert changed.json()["error"]["param"] == "Idempotency-Key"
    assert changed.json()["error"]["type"] == "idempotency_error"
    too_long = await _post(client, "/v1/embeddings", root[0], body, "k" * 256)
    assert too_long.status_code == 400
    assert too_long.json()["error"]["param"] == "Idempotency-Key"
    assert too_long.headers["x-request-id"]
    ok_length = await _post(client, "/v1/embeddings", root[0], body, "k" * 255)
    assert ok_length.status_code == 404


async def test_a_running_duplicate_is_409_retryable(
    app_client: tuple[httpx.AsyncClient, Kiln], root: tuple[str, uuid.UUID]
) -> None:
    client, kiln = app_client
    body, key = {"name": "running-co"}, str(uuid.uuid4())
    raw = json.dumps(body).encode()
    mac = kiln.idempotency.fingerprinter()
    mac.update(b"\n" + raw)
    async with kiln.db.sessions() as session:
        tenant_id = await session.scalar(select(Tenant.id).where(Tenant.name == "operators"))
    assert tenant_id is not None
    where = KeyScope(tenant_id, f"key:{root[1]}", "POST", "/admin/v1/tenants", key)
    assert await kiln.idempotency.claim(where, mac.digest(), "req_elsewhere") is None
    dup = await _post(client, "/admin/v1/tenants", root[0], body, key)
    assert dup.status_code == 409
    assert dup.headers["x-should-retry"] == "true"
    assert dup.headers["retry-after"] == "1"
    assert dup.json()["title"] == "idempotency_key_in_use"
    assert await _count(kiln, Tenant.name == "running-co") == 0
    await kiln.idempotency.release(where, "req_elsewhere")  # the first one failed
    retried = await _post(client, "/admin/v1/tenants", root[0], body, key)
    assert retried.status_code == 201


async def test_key_secret_replayed_but_sealed_at_rest(
    app_client: tuple[httpx.AsyncClient, Kiln], root: tuple[str, uuid.UUID]
) -> None:
    client, kiln = app_client
    tenant = (await _post(client, "/admin/v1/tenants", root[0], {"name": "keyed-co"}, None)).json()
    path, key = f"/admin/v1/tenants/{tenant['id']}/keys", str(uuid.uuid4())
    first = await _post(client, path, root[0], {"name": "ci"}, key)
    again = await _post(client, path, root[0], {"name": "ci"}, key)
    assert first.status_code == again.status_code == 201
    secret = first.json()["secret"]
    assert again.json()["secret"] == secret
    async with kiln.db.sessions() as session:
        stored = await session.scalar(select(IdempotencyKey.body).where(IdempotencyKey.key == key))
    assert stored is not None
    assert secret.encode() not in stored
    assert secret.split("_", 2)[2].encode() not in stored  # the random part (it may hold "_")


async def test_unstored_outcomes_and_pass_through(
    app_client: tuple[httpx.AsyncClient, Kiln], root: tuple[str, uuid.UUID]
) -> None:
    client, kiln = app_client
    rows = await _count(kiln, table=IdempotencyKey)
    plain = await _post(client, "/admin/v1/tenants", root[0], {"name": "plain-co"}, None)
    assert plain.status_code == 201
    no_auth = await client.post(
        "/admin/v1/tenants", json={"name": "x"}, headers={"idempotency-key": "k-noauth"}
    )
    assert no_auth.status_code == 401
    bad_key = await _post(client, "/admin/v1/tenants", "kiln_00000000_nope", {"name": "x"}, "k2")
    assert bad_key.status_code == 401
    assert await _count(kiln, table=IdempotencyKey) == rows  # nothing claimed or stored
    key = str(uuid.uuid4())  # a 409 from the route (the name is taken) is not stored
    taken = await _post(client, "/admin/v1/tenants", root[0], {"name": "plain-co"}, key)
    assert taken.status_code == 409
    assert await _count(kiln, IdempotencyKey.key == key, table=IdempotencyKey) == 0
    renamed = await _post(client, "/admin/v1/tenants", root[0], {"name": "plain-co"}, key)
    assert "idempotent-replayed" not in renamed.headers  # it ran again
