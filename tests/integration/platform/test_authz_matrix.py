"""Role x route matrix: every ``/admin/v1`` and ``/console`` route of ``create_app(settings)``,
every method, called as every kind of caller, answers the status class this module's declared
table predicts through the permission table (``admin.authz._RULES``).

A route of the app missing from ``ADMIN``/``CONSOLE`` fails the suite (and so does a stale row).
Bodies are empty or invalid: an allowed write answers 400/404/422 (authorization passed before
validation), a denied one 403 — guards decide before any body is read.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from litestar import Litestar
from litestar.routes import HTTPRoute
from pydantic import SecretStr
from sqlalchemy import select

from kiln_console.compose import create_app
from kiln_platform.admin.authz import _RULES, Role, RoleName
from kiln_platform.billing import pricebooks
from kiln_platform.billing.schemas import PriceBookCreate, PriceIn
from kiln_platform.db.tables import Adapter, CompileJob, Model, ModelVersion
from kiln_platform.gateway.responses_schemas import ResponseObject
from kiln_platform.keys.schemas import Scope
from kiln_platform.oauth import services as oauth_services
from kiln_platform.oauth.schemas import ClientCreate
from kiln_platform.registry.tables import ModelRollout
from kiln_platform.reports import statements
from kiln_platform.settings import Settings
from kiln_platform.slo import receivers
from kiln_platform.slo import services as slo_services
from kiln_platform.slo.schemas import ReceiverCreate, SloCreate
from kiln_platform.users.schemas import UserCreate
from kiln_platform.users.services import create_user
from kiln_platform.webhooks import signing
from kiln_platform.webhooks.tables import WebhookDelivery, WebhookEndpoint
from tests.asgi import asgi
from tests.factories import CLI, make_key, make_tenant

from .conftest import register_tiny_llm, serving
from .console.conftest import PASSWORD, csrf

PUBLIC, SIGNED_IN = "public", "signed-in"

# (method, route path as the app declares it) -> the resource it reads (GET) or writes.
HOOK = "/admin/v1/tenants/{tenant_id:uuid}/webhooks/{webhook_id:uuid}"
CONSOLE_HOOK = "/console/tenants/{tenant_id:uuid}/webhooks/{webhook_id:uuid}"
ADMIN: dict[tuple[str, str], str] = {
    ("GET", "/admin/v1/tenants"): "tenants",
    ("POST", "/admin/v1/tenants"): "tenants",
    ("GET", "/admin/v1/tenants/{tenant_id:uuid}"): "tenants",
    ("PATCH", "/admin/v1/tenants/{tenant_id:uuid}"): "tenants",
    ("DELETE", "/admin/v1/tenants/{tenant_id:uuid}"): "tenants",
    ("GET", "/admin/v1/tenants/{tenant_id:uuid}/keys"): "keys",
    ("POST", "/admin/v1/tenants/{tenant_id:uuid}/keys"): "keys",
    ("DELETE", "/admin/v1/tenants/{tenant_id:uuid}/keys/{key_id:uuid}"): "keys",
    ("POST", "/admin/v1/tenants/{tenant_id:uuid}/keys/{key_id:uuid}/rotate"): "keys",
    ("GET", "/admin/v1/tenants/{tenant_id:uuid}/oauth-clients"): "oauth-clients",
    ("POST", "/admin/v1/tenants/{tenant_id:uuid}/oauth-clients"): "oauth-clients",
    ("DELETE", "/admin/v1/tenants/{tenant_id:uuid}/oauth-clients/{client_id:uuid}"):
        "oauth-clients",
    ("GET", "/admin/v1/tenants/{tenant_id:uuid}/adapters"): "adapters",
    ("POST", "/admin/v1/tenants/{tenant_id:uuid}/adapters"): "adapters",
    ("DELETE", "/admin/v1/tenants/{tenant_id:uuid}/adapters/{adapter_id:uuid}"): "adapters",
    ("GET", "/admin/v1/users"): "users",
    ("POST", "/admin/v1/users"): "users",
    ("GET", "/admin/v1/users/{user_id:uuid}"): "users",
    ("PATCH", "/admin/v1/users/{user_id:uuid}"): "users",
    ("DELETE", "/admin/v1/users/{user_id:uuid}"): "users",
    ("GET", "/admin/v1/quotas/{tenant_id:uuid}"): "quotas",
    ("PUT", "/admin/v1/quotas/{tenant_id:uuid}"): "quotas",
    ("PUT", "/admin/v1/quotas/{tenant_id:uuid}/keys/{key_id:uuid}"): "quotas",
    ("GET", "/admin/v1/models/{name:str}/route"): "models",
    ("PUT", "/admin/v1/models/{name:str}/route"): "models",
    ("GET", "/admin/v1/models/{name:str}/aliases"): "models",
    ("PUT", "/admin/v1/models/{name:str}/aliases/{alias:str}"): "models",
    ("DELETE", "/admin/v1/models/{name:str}/aliases/{alias:str}"): "models",
    ("GET", "/admin/v1/models/{name:str}/shadow"): "model-shadows",
    ("PUT", "/admin/v1/models/{name:str}/shadow"): "model-shadows",
    ("DELETE", "/admin/v1/models/{name:str}/shadow"): "model-shadows",
    ("GET", "/admin/v1/models/{name:str}/pins"): "model-pins",
    ("PUT", "/admin/v1/models/{name:str}/pins/{tenant_id:uuid}"): "model-pins",
    ("DELETE", "/admin/v1/models/{name:str}/pins/{tenant_id:uuid}"): "model-pins",
    ("GET", "/admin/v1/models/{name:str}/rollout"): "model-rollouts",
    ("PUT", "/admin/v1/models/{name:str}/rollout"): "model-rollouts",
    ("DELETE", "/admin/v1/models/{name:str}/rollout"): "model-rollouts",
    ("POST", "/admin/v1/models/{name:str}/versions"): "models",
    ("GET", "/admin/v1/models/{name:str}/versions/{version:str}"): "models",
    ("PATCH", "/admin/v1/models/{name:str}/versions/{version:str}"): "models",
    ("POST", "/admin/v1/models/{name:str}/versions/{version:str}/compile"): "compile-jobs",
    ("GET", "/admin/v1/compile-jobs"): "compile-jobs",
    ("GET", "/admin/v1/compile-jobs/{job_id:uuid}"): "compile-jobs",
    ("GET", "/admin/v1/audit"): "audit",
    ("GET", "/admin/v1/reports/costs"): "reports",
    ("GET", "/admin/v1/tenants/{tenant_id:uuid}/statements"): "statements",
    ("GET", "/admin/v1/tenants/{tenant_id:uuid}/statements/{period:str}"): "statements",
    ("POST", "/admin/v1/tenants/{tenant_id:uuid}/statements/{period:str}/close"): "statements",
    ("POST", "/admin/v1/tenants/{tenant_id:uuid}/adjustments"): "adjustments",
    ("GET", "/admin/v1/price-books"): "price-books",
    ("POST", "/admin/v1/price-books"): "price-books",
    ("GET", "/admin/v1/price-books/{version:int}"): "price-books",
    ("GET", "/admin/v1/slos"): "slos",
    ("POST", "/admin/v1/slos"): "slos",
    ("GET", "/admin/v1/slos/{slo:str}/status"): "slos",
    ("DELETE", "/admin/v1/slos/{slo:str}"): "slos",
    ("GET", "/admin/v1/alerts"): "alerts",
    ("GET", "/admin/v1/tenants/{tenant_id:uuid}/webhooks"): "webhooks",
    ("POST", "/admin/v1/tenants/{tenant_id:uuid}/webhooks"): "webhooks",
    ("PATCH", "/admin/v1/tenants/{tenant_id:uuid}/webhooks/{webhook_id:uuid}"): "webhooks",
    ("DELETE", "/admin/v1/tenants/{tenant_id:uuid}/webhooks/{webhook_id:uuid}"): "webhooks",
    ("POST", f"{HOOK}/rotate-secret"): "webhooks",
    ("GET", f"{HOOK}/deliveries"): "webhooks",
    ("POST", f"{HOOK}/deliveries/{{delivery_id:uuid}}/redeliver"): "webhooks",
    ("GET", "/admin/v1/alert-receivers"): "alert-receivers",
    ("POST", "/admin/v1/alert-receivers"): "alert-receivers",
    ("DELETE", "/admin/v1/alert-receivers/{receiver_id:uuid}"): "alert-receivers",
}  # fmt: skip

CONSOLE: dict[tuple[str, str], str] = {
    ("GET", "/console/login"): PUBLIC,
    ("POST", "/console/login"): PUBLIC,
    ("POST", "/console/logout"): PUBLIC,
    ("GET", "/console/sso"): PUBLIC,
    ("GET", "/console/sso/callback"): PUBLIC,
    ("GET", "/console/static/{file_path:path}"): PUBLIC,
    ("HEAD", "/console/static/{file_path:path}"): PUBLIC,
    ("GET", "/console"): SIGNED_IN,
    ("GET", "/console/overview"): "overview",
    ("GET", "/console/tenants"): "tenants",
    ("GET", "/console/tenants/{tenant_id:uuid}/keys"): "keys",
    ("POST", "/console/tenants/{tenant_id:uuid}/keys"): "keys",
    ("POST", "/console/tenants/{tenant_id:uuid}/keys/{key_id:uuid}/revoke"): "keys",
    ("POST", "/console/tenants/{tenant_id:uuid}/keys/{key_id:uuid}/rotate"): "keys",
    ("GET", "/console/tenants/{tenant_id:uuid}/clients"): "oauth-clients",
    ("POST", "/console/tenants/{tenant_id:uuid}/clients"): "oauth-clients",
    ("POST", "/console/tenants/{tenant_id:uuid}/clients/{client_id:uuid}/revoke"):
        "oauth-clients",
    ("GET", "/console/tenants/{tenant_id:uuid}/users"): "users",
    ("POST", "/console/tenants/{tenant_id:uuid}/users"): "users",
    ("POST", "/console/tenants/{tenant_id:uuid}/users/{user_id:uuid}/role"): "users",
    ("POST", "/console/tenants/{tenant_id:uuid}/users/{user_id:uuid}/remove"): "users",
    ("GET", "/console/tenants/{tenant_id:uuid}/quotas"): "quotas",
    ("GET", "/console/tenants/{tenant_id:uuid}/adapters"): "adapters",
    ("POST", "/console/tenants/{tenant_id:uuid}/adapters"): "adapters",
    ("POST", "/console/tenants/{tenant_id:uuid}/adapters/{adapter_id:uuid}/delete"): "adapters",
    ("GET", "/console/costs"): "reports",
    ("GET", "/console/costs.csv"): "reports",
    ("GET", "/console/finance"): "reports",
    ("GET", "/console/models"): "models",
    ("POST", "/console/models/{name:str}/route"): "models",
    ("GET", "/console/models/{name:str}/pools"): "models",
    ("POST", "/console/models/{name:str}/versions/{version:str}/engine"): "models",
    ("POST", "/console/models/import"): "models",
    ("GET", "/console/compile-jobs/{job_id:uuid}"): "compile-jobs",
    ("GET", "/console/audit"): "audit",
    ("GET", "/console/slos"): "slos",
    ("POST", "/console/slos"): "slos",
    ("POST", "/console/slos/{slo:str}/delete"): "slos",
    ("GET", "/console/alerts"): "alerts",
    ("GET", "/console/tenants/{tenant_id:uuid}/webhooks"): "webhooks",
    ("POST", "/console/tenants/{tenant_id:uuid}/webhooks"): "webhooks",
    ("GET", f"{CONSOLE_HOOK}"): "webhooks",
    ("POST", f"{CONSOLE_HOOK}/rotate-secret"): "webhooks",
    ("POST", f"{CONSOLE_HOOK}/delete"): "webhooks",
    ("POST", f"{CONSOLE_HOOK}/deliveries/{{delivery_id:uuid}}/redeliver"): "webhooks",
    ("GET", "/console/tenants/{tenant_id:uuid}/logs"): "logs",
    ("GET", "/console/tenants/{tenant_id:uuid}/logs/{completion_id:str}"): "logs",
    ("GET", "/console/tenants/{tenant_id:uuid}/logs/responses/{response_id:str}"): "logs",
    ("POST", "/console/tenants/{tenant_id:uuid}/logs/{completion_id:str}/delete"): "logs",
    ("POST", "/console/tenants/{tenant_id:uuid}/logs/responses/{response_id:str}/delete"):
        "logs",
}  # fmt: skip

ADMIN_SCOPES = frozenset({"admin:read", "admin:write"})
WRITE_SCOPES = frozenset({"admin:write"})
READ_METHODS = frozenset({"GET", "HEAD"})
_PARAM = re.compile(r"\{(\w+):\w+\}")


@dataclass(frozen=True)
class Caller:
    """One kind of caller: its role, scopes, and the tenant it is confined to (None: all)."""

    name: str
    role: Role | None  # None: anonymous
    scopes: frozenset[str]
    tenant: uuid.UUID | None
    credential: str = ""

    def expect(self, method: str, resource: str, target: uuid.UUID | None) -> str:
        """``allow``, ``401``, ``403`` or ``404``, in the order the guards decide."""
        if self.role is None:
            return "401"
        write = method not in READ_METHODS
        if not self.scopes & ADMIN_SCOPES:
            return "403"  # an inference-only key never reaches an admin route
        if self.role is Role.FINANCE and write:
            return "403"
        if target is not None and self.tenant is not None and target != self.tenant:
            return "404"  # another tenant's objects are indistinguishable from absent ones
        if write and not self.scopes & WRITE_SCOPES:
            return "403"
        readers, writers = _RULES[resource]
        return "allow" if self.role in (writers if write else readers) else "403"


def app_routes(app: Litestar, prefix: str) -> set[tuple[str, str]]:
    """Every (method, path) under ``prefix`` (Litestar's automatic OPTIONS left out)."""
    return {
        (method, route.path)
        for route in app.routes
        if isinstance(route, HTTPRoute) and route.path.startswith(prefix)
        for method in route.route_handler_map
        if method != "OPTIONS"
    }


@pytest.fixture(scope="module")
def settings(database_uri: str, tmp_path_factory: pytest.TempPathFactory) -> Settings:
    return Settings(
        data_dir=tmp_path_factory.mktemp("data"), database_url=database_uri,
        secret_key=SecretStr("matrix-test-secret"), key_cache_ttl_s=0.0, pool_initial_replicas=0,
    )  # fmt: skip


@dataclass
class World:
    """The app, its HTTP transport, tenants A (the callers') and B (another), and factories for
    the objects a path names (a fresh one for each destructive call)."""

    app: Litestar
    transport: httpx.ASGITransport
    a: uuid.UUID
    b: uuid.UUID
    model: str
    shared_job: str = ""
    price_book: int = 0
    webhooks: dict[str, uuid.UUID] = field(default_factory=dict)

    @property
    def kiln(self) -> Any:
        return self.app.state.kiln

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=self.transport, base_url="http://127.0.0.1")

    async def slo(self) -> str:
        """A new SLO (its name) on the world's model."""
        name = f"s{uuid.uuid4().hex[:8]}"
        async with self.kiln.db.sessions.begin() as session:
            await slo_services.create_slo(
                session, CLI, SloCreate(name=name, model=self.model, availability=0.99)
            )
        return name

    async def receiver(self) -> str:
        """A new alert receiver (its id)."""
        data = ReceiverCreate(name=f"r{uuid.uuid4().hex[:8]}", url="http://127.0.0.1:9/hook")
        async with self.kiln.db.sessions.begin() as session:
            made = await receivers.create_receiver(
                session, CLI, data, receivers.receiver_seal(b"k")
            )
        return str(made.receiver.id)

    async def webhook(self, tenant: uuid.UUID) -> str:
        """A new webhook endpoint of ``tenant`` (its id)."""
        async with self.kiln.db.sessions.begin() as session:
            eid, seal = uuid.uuid4(), signing.webhook_seal(self.kiln.settings.hmac_key())
            row = WebhookEndpoint(
                id=eid, tenant_id=tenant, url="http://127.0.0.1:9/hook", events=["batch.failed"],
                secret_sealed=signing.seal_secret(seal, eid, signing.new_secret()),
            )  # fmt: skip
            session.add(row)
            await session.flush()
            self.webhooks[str(row.id)] = tenant
            return str(row.id)

    async def chat(self, tenant: uuid.UUID) -> str:
        """A new stored chat completion of ``tenant`` (its id)."""
        ident = f"chatcmpl-{uuid.uuid4().hex}"
        body = {"id": ident, "model": self.model, "created": 1, "choices": [], "metadata": {}}
        await self.kiln.chats.save(tenant, body, [{"role": "user", "content": "Hi"}])
        return ident

    async def response(self, tenant: uuid.UUID) -> str:
        """A new stored response of ``tenant`` (its id)."""
        ident = f"resp-{uuid.uuid4().hex}"
        made = ResponseObject(
            id=ident, created_at=1, model=self.model, status="completed", output=[],
            instructions=None, max_output_tokens=None, temperature=1.0, top_p=1.0, usage=None,
            user=None, metadata={},
        )  # fmt: skip
        await self.kiln.responses.save(tenant, made, [{"role": "user", "content": "Hi"}])
        return ident

    async def delivery(self, tenant: uuid.UUID) -> str:
        """A delivered delivery of the webhook the path names last (its id)."""
        endpoint = next(e for e, t in reversed(self.webhooks.items()) if t == tenant)
        async with self.kiln.db.sessions.begin() as session:
            row = WebhookDelivery(
                tenant_id=tenant, endpoint_id=uuid.UUID(endpoint), event_type="batch.failed",
                payload={}, state="delivered",
            )  # fmt: skip
            session.add(row)
            await session.flush()
            return str(row.id)

    async def tenant(self) -> uuid.UUID:
        async with self.kiln.db.sessions.begin() as session:
            return await make_tenant(session)

    async def key(
        self, tenant: uuid.UUID, role: RoleName | None = None, *scopes: Scope
    ) -> tuple[str, str]:
        async with self.kiln.db.sessions.begin() as session:
            made = await make_key(
                session, self.kiln.settings.hmac_key(), tenant, scopes or ("inference",),
                role=role,
            )  # fmt: skip
        return str(made.key.id), made.secret

    async def oauth_client(self, tenant: uuid.UUID, *scopes: str) -> tuple[str, str, str]:
        data = ClientCreate(name="c", scopes=list(scopes or ("inference",)))  # type: ignore[arg-type]
        async with self.kiln.db.sessions.begin() as session:
            made = await oauth_services.create_client(
                session, CLI, tenant, data, self.kiln.settings.hmac_key()
            )
        return str(made.client.id), made.client.client_id, made.client_secret

    async def user(self, role: str, tenant: uuid.UUID | None) -> tuple[str, str]:
        email = f"{role}-{uuid.uuid4().hex[:8]}@example.com"
        data = UserCreate(email=email, password=PASSWORD, role=role, tenant_id=tenant)  # type: ignore[arg-type]
        async with self.kiln.db.sessions.begin() as session:
            made = await create_user(session, CLI, data)
        return str(made.id), email

    async def adapter(self, tenant: uuid.UUID) -> str:
        async with self.kiln.db.sessions.begin() as session:
            row = Adapter(
                tenant_id=tenant, model_id=await session.scalar(select(Model.id).limit(1)),
                name=f"a{uuid.uuid4().hex[:8]}", digest="sha256:" + "0" * 64, rank=4,
                modules=["q_proj"], size_bytes=1,
            )  # fmt: skip
            session.add(row)
            await session.flush()
            return str(row.id)

    async def job(self) -> str:
        async with self.kiln.db.sessions.begin() as session:
            row = CompileJob(
                model_version_id=await session.scalar(select(ModelVersion.id).limit(1)),
                cache_key=f"sha256:{uuid.uuid4().hex * 2}", target="cpu", precision="fp32",
                hardware="cpu", status="done",
            )  # fmt: skip
            session.add(row)
            await session.flush()
            return str(row.id)


@pytest.fixture(scope="module")
async def world(
    settings: Settings, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[World]:
    app = create_app(settings)
    async with serving(app):
        kiln = app.state.kiln
        model = await register_tiny_llm(kiln, tmp_path_factory.mktemp("tiny-llm"))
        w = World(app, httpx.ASGITransport(app=asgi(app), client=("127.0.0.1", 1)), uuid.uuid4(),
                  uuid.uuid4(), model)  # fmt: skip
        w.a, w.b = await w.tenant(), await w.tenant()
        w.shared_job = await w.job()
        async with kiln.db.sessions.begin() as session:  # a price book and closed statements
            price = PriceIn(model="m", unit="input_token", unit_price_micros="1")
            book = PriceBookCreate(prices=[price], effective_from=datetime(2024, 1, 1, tzinfo=UTC))
            w.price_book = (await pricebooks.create_book(session, CLI, book)).version
            for tenant in (w.a, w.b):
                await statements.close_statement(session, CLI, tenant, "2025-01")
            session.add(ModelRollout(  # a finished rollout: GET shows it, DELETE is a 409
                model_id=await session.scalar(select(Model.id).where(Model.name == model)),
                stable_version="1", canary_version="2", plan={"steps": [50, 100]},
                state="completed", step_started_at=datetime.now(UTC), created_by=CLI.name,
            ))  # fmt: skip
        yield w


async def _fill(world: World, path: str, tenant: uuid.UUID) -> str:
    """The path with real ids: ``tenant`` for ``tenant_id``, a new object of it for the others
    (so a call that deletes or revokes one leaves the others' alone)."""
    made: dict[str, Callable[[], Awaitable[str]]] = {
        "key_id": lambda: _first(world.key(tenant)),
        "client_id": lambda: _first(world.oauth_client(tenant)),
        "user_id": lambda: _first(world.user("tenant-member", tenant)),
        "adapter_id": lambda: world.adapter(tenant),
        "slo": world.slo,
        "receiver_id": world.receiver,
        "webhook_id": lambda: world.webhook(tenant),
        "delivery_id": lambda: world.delivery(tenant),
        "completion_id": lambda: world.chat(tenant),
        "response_id": lambda: world.response(tenant),
    }
    fixed = {
        "tenant_id": str(tenant), "name": world.model, "period": "2025-01",
        "version": str(world.price_book) if "/price-books/" in path else "1",
        "job_id": world.shared_job, "file_path": "htmx-2.0.11.min.js", "alias": "prod",
    }  # fmt: skip

    async def value(name: str) -> str:
        return await made[name]() if name in made else fixed[name]

    out = path
    for name in _PARAM.findall(path):
        out = re.sub(r"\{" + name + r":\w+\}", await value(name), out, count=1)
    return out


async def _first(made: Awaitable[tuple[str, ...]]) -> str:
    return (await made)[0]


async def _admin_callers(world: World) -> list[Caller]:
    both: tuple[Scope, ...] = ("admin:read", "admin:write")
    ops = await world.tenant()
    out = [Caller("anonymous", None, frozenset(), None)]
    keys: list[tuple[str, uuid.UUID, RoleName | None, tuple[Scope, ...]]] = [
        ("platform-admin key", ops, "platform-admin", (*both, "inference")),
        ("tenant-admin key", world.a, "tenant-admin", (*both, "inference")),
        ("tenant-admin read-only key", world.a, "tenant-admin", ("admin:read",)),
        ("tenant-member key", world.a, "tenant-member", ("admin:read",)),
        ("finance key", world.a, "finance", both),
        ("inference-only key", world.a, None, ("inference",)),
    ]
    for name, tenant, role, scopes in keys:
        _, secret = await world.key(tenant, role, *scopes)
        confined = None if role == "platform-admin" else tenant
        out.append(Caller(name, Role(role or "tenant-member"), frozenset(scopes), confined, secret))
    _, cid, secret = await world.oauth_client(world.a, *both)
    async with world.client() as http:
        r = await http.post("/oauth/token", data={"grant_type": "client_credentials"},
                            auth=(cid, secret))  # fmt: skip
    assert r.status_code == 200, r.text
    token = str(r.json()["access_token"])
    out.append(Caller("oauth admin client", Role.TENANT_ADMIN, frozenset(both), world.a, token))
    return out


def _body(method: str, path: str) -> dict[str, Any]:
    """A body that fails validation (or nothing): an allowed call stops after authorization."""
    if method in READ_METHODS or method == "DELETE":
        return {}
    if path.endswith("/versions"):
        return {"content": b""}  # an empty upload: 400 once authorized
    if path.endswith("/adapters"):
        return {"files": {"config": ("adapter_config.json", b"{}")}, "data": {"name": ""}}
    return {"json": {"no such field": 1}}


def _outcome(r: httpx.Response) -> str:
    if r.status_code in {401, 403, 404}:
        return str(r.status_code)
    if r.status_code == 303 and r.headers.get("location") == "/console/login":
        return "login"
    return "allow" if r.status_code < 500 else f"error {r.status_code}"


async def test_every_route_has_a_rule(world: World) -> None:
    """A new route without a row in the table fails here (and a removed one's row too)."""
    assert app_routes(world.app, "/admin/v1") == set(ADMIN)
    assert app_routes(world.app, "/console") == set(CONSOLE)
    assert {r for r in ADMIN.values()} <= set(_RULES)
    assert {r for r in CONSOLE.values()} - {PUBLIC, SIGNED_IN} <= set(_RULES)


async def test_admin_matrix(world: World) -> None:
    callers = await _admin_callers(world)
    checked, wrong = 0, []
    async with world.client() as http:
        for (method, path), resource in sorted(ADMIN.items()):
            tenants = [world.a, world.b] if "{tenant_id" in path else [None]
            for caller in callers:
                for target in tenants:
                    expected = caller.expect(method, resource, target)
                    tenant = target or world.a
                    if (method, resource) == ("DELETE", "tenants") and expected == "allow":
                        tenant = await world.tenant()  # not the tenant the other callers use
                    url = await _fill(world, path, tenant)
                    headers = (
                        {"authorization": f"Bearer {caller.credential}"} if caller.role else {}
                    )
                    r = await http.request(method, url, headers=headers, **_body(method, path))
                    checked += 1
                    if _outcome(r) != expected:
                        wrong.append(
                            (caller.name, method, url, expected, r.status_code, r.text[:120])
                        )
    assert not wrong, "\n".join(map(str, wrong))
    print(f"admin matrix: {checked} (route, caller) pairs checked, {len(callers)} callers")
    assert checked >= len(ADMIN) * len(callers)


@dataclass(frozen=True)
class Viewer:
    """A console user (or anonymous): its role and the tenant it is confined to."""

    name: str
    role: Role | None
    tenant: uuid.UUID | None

    def expect(self, method: str, rule: str, target: uuid.UUID | None) -> str:
        if rule == PUBLIC:
            return "public"
        if self.role is None:
            return "login"
        if target is not None and self.tenant is not None and target != self.tenant:
            return "404"
        if rule == SIGNED_IN:
            return "allow"
        readers, writers = _RULES[rule]
        return "allow" if self.role in (writers if method != "GET" else readers) else "403"


@asynccontextmanager
async def _session(world: World, email: str | None) -> AsyncIterator[tuple[httpx.AsyncClient, str]]:
    """A browser with the CSRF cookie and token, signed in as ``email`` (None: anonymous)."""
    async with world.client() as http:
        token = csrf(await http.get("/console/login"))
        if email is not None:
            r = await http.post("/console/login", data={"email": email, "password": PASSWORD,
                                                        "_csrf_token": token})  # fmt: skip
            assert r.status_code == 303, r.text
            token = http.cookies["kiln_csrf"]  # sign-in issues the session its own token
        yield http, token


async def test_console_matrix(world: World) -> None:
    viewers = [Viewer("anonymous", None, None)]
    emails: list[str | None] = [None]
    for role, tenant in (("platform-admin", None), ("tenant-admin", world.a),
                         ("tenant-member", world.a), ("finance", None)):  # fmt: skip
        emails.append((await world.user(role, tenant))[1])
        viewers.append(Viewer(role, Role(role), tenant))
    checked, wrong = 0, []
    for viewer, email in zip(viewers, emails, strict=True):
        async with _session(world, email) as (http, token):
            for (method, path), rule in sorted(CONSOLE.items()):
                if path in {"/console/logout", "/console/login"} and method == "POST":
                    continue  # signs this session out (or in); public either way
                tenants = [world.a, world.b] if "{tenant_id" in path else [None]
                for target in tenants:
                    url = await _fill(world, path, target or world.a)
                    kw: dict[str, Any] = {"headers": {"x-csrftoken": token}}
                    if method == "POST" and path.endswith("/adapters"):
                        kw["files"] = {"config": ("adapter_config.json", b"{}")}
                    r = await http.request(method, url, **kw)
                    expected = viewer.expect(method, rule, target)
                    got = _outcome(r)
                    checked += 1
                    ok = r.status_code < 500 if expected == "public" else got == expected
                    if not ok:
                        wrong.append((viewer.name, method, url, expected, r.status_code))
    assert not wrong, "\n".join(map(str, wrong))
    print(f"console matrix: {checked} (route, viewer) pairs checked, {len(viewers)} viewers")
    assert checked >= (len(CONSOLE) - 2) * len(viewers)


def test_the_table_predicts_model_writes_for_platform_admins_only() -> None:
    """The rows this slice is about, spelled out (not only derived from ``_RULES``)."""
    tenant = uuid.uuid4()
    tenant_admin = Caller("t", Role.TENANT_ADMIN, frozenset({"admin:write", "inference"}), tenant)
    platform = Caller("p", Role.PLATFORM_ADMIN, frozenset({"admin:write"}), None)
    for (method, _), resource in ADMIN.items():
        if resource in {"models", "compile-jobs"} and method != "GET":
            assert tenant_admin.expect(method, resource, None) == "403"
            assert platform.expect(method, resource, None) == "allow"
    assert tenant_admin.expect("GET", "compile-jobs", None) == "403"
