"""Row-level security, the second wall, forced: the app's role sees a tenant table's rows only
in a transaction that declares whose (one tenant, or platform scope); one that forgets sees none.
And the tenant-confined ``kiln_tenant`` role sees only its tenant's rows whatever the scope."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from sqlalchemy import make_url, text
from sqlalchemy.ext.asyncio import AsyncConnection

from kiln_platform.batches.tables import BatchJob, BatchLine, StoredFile
from kiln_platform.billing.tables import (
    BudgetEvent,
    BudgetPeriod,
    BudgetReservation,
    IdempotencyKey,
    Statement,
    UsageCharge,
    UsageChargeDaily,
    UsageChargeModelDaily,
    UsageHourly,
    UsageTenantDaily,
)
from kiln_platform.db.database import open_database
from kiln_platform.db.engine import (
    APP_ROLE,
    app_password,
    asyncpg_url,
    create_engine,
    sessionmaker,
)
from kiln_platform.db.migrate import UnsafeDatabaseRole, check_app_role
from kiln_platform.db.tables import (
    Adapter,
    ApiKey,
    AuditRecord,
    Base,
    Model,
    ModelPin,
    OAuthClient,
    Quota,
    Tenant,
    UsageEvent,
    User,
)
from kiln_platform.gateway.chat_store import StoredChat
from kiln_platform.gateway.conversations import Conversation, ConversationItem
from kiln_platform.gateway.response_events import EventRun
from kiln_platform.gateway.response_store import StoredResponse
from kiln_platform.settings import Settings
from kiln_platform.webhooks.tables import WebhookAttempt, WebhookDelivery, WebhookEndpoint

from .conftest import Admin

NOW = datetime.now(UTC)
TENANT_TABLES = text(
    "SELECT table_name FROM information_schema.columns WHERE table_schema = current_schema()"
    " AND column_name = 'tenant_id'"
)


def _rows(tenant: uuid.UUID, model: uuid.UUID) -> list[Base]:
    """One row of every tenant table for ``tenant`` (its ``tenants`` row comes first)."""
    n = uuid.uuid4().hex[:8]
    key = ApiKey(id=uuid.uuid4(), tenant_id=tenant, prefix=f"kiln_{n}", digest=b"\0" * 32,
                 scopes=["inference"])  # fmt: skip
    file = StoredFile(id=uuid.uuid4(), tenant_id=tenant, filename="in.jsonl", purpose="batch",
                      bytes=1, lines=1, digest="0" * 64)  # fmt: skip
    batch = BatchJob(id=uuid.uuid4(), tenant_id=tenant, endpoint="/v1/embeddings",
                     input_file_id=file.id, completion_window="24h", status="validating",
                     principal={}, expires_at=NOW + timedelta(hours=24))  # fmt: skip
    hook = WebhookEndpoint(id=uuid.uuid4(), tenant_id=tenant, url="https://example.com/h",
                           events=["batch.failed"], secret_sealed=b"s")  # fmt: skip
    delivery = WebhookDelivery(id=uuid.uuid4(), tenant_id=tenant, endpoint_id=hook.id,
                               event_type="batch.failed", payload={})  # fmt: skip
    # fmt: off
    return [
        Tenant(id=tenant, name=f"rls-{n}"),
        key,
        Adapter(tenant_id=tenant, model_id=model, name=n, digest="sha256:" + "0" * 64, rank=4,
                modules=["q"], size_bytes=1),
        UsageEvent(request_id=f"req-{n}", tenant_id=tenant, api_key_id=key.id, model="m",
                   version="1", endpoint="e", status=200),
        User(email=f"{n}@rls.test", password_hash="x", role="tenant-member", tenant_id=tenant),
        Quota(tenant_id=tenant, rpm=1),
        AuditRecord(actor="t", actor_role="platform-admin", tenant_id=tenant, action="a",
                    target_type="t", target_id=n),
        OAuthClient(tenant_id=tenant, client_id=f"c-{n}", secret_digest=b"\0" * 32, name=n,
                    scopes=["inference"]),
        UsageCharge(request_id=f"req-{n}", tenant_id=tenant, model="m", version="1", unit="request",
                    quantity=Decimal(1), unit_price_micros=Decimal(1), list_cost_micros=1,
                    cost_micros=1, currency="USD", charged_at=NOW),
        BudgetPeriod(tenant_id=tenant, period=date(2026, 12, 1)),
        BudgetReservation(request_id=f"req-{n}", tenant_id=tenant, period=date(2026, 12, 1),
                          amount_micros=1, expires_at=NOW + timedelta(hours=1)),
        BudgetEvent(tenant_id=tenant, period=date(2026, 12, 1), threshold_percent=50,
                    spent_micros=1, limit_micros=2),
        IdempotencyKey(tenant_id=tenant, credential="k", method="POST", path="/p", key=n,
                       fingerprint=b"\0" * 32, request_id=f"req-{n}",
                       expires_at=NOW + timedelta(hours=1)),
        Statement(tenant_id=tenant, period=date(2026, 11, 1), currency="USD", list_cost_micros=1,
                  cost_micros=1, lines=1, closed_by="t"),
        UsageHourly(tenant_id=tenant, hour=NOW.replace(minute=0, second=0, microsecond=0),
                    model="m", latency_bucket=0, requests=1, errors=0, input_tokens=1,
                    output_tokens=0, cost_micros=1),
        UsageTenantDaily(day=date(2026, 12, 1), tenant_id=tenant, requests=1, errors=0,
                         cost_micros=1),
        UsageChargeDaily(tenant_id=tenant, day=date(2026, 11, 30), kind="usage", model="m",
                         version="1", unit="request", currency="USD", quantity=Decimal(1),
                         list_cost_micros=1, cost_micros=1, lines=1),
        UsageChargeModelDaily(tenant_id=tenant, day=date(2026, 11, 30), kind="usage", model="m",
                              unit="request", currency="USD", quantity=Decimal(1),
                              list_cost_micros=1, cost_micros=1, lines=1),
        ModelPin(model_id=model, tenant_id=tenant, target="1"),
        file,
        batch,
        BatchLine(batch_id=batch.id, custom_id="c", tenant_id=tenant, line=1, ok=True, output="{}"),
        StoredResponse(id=f"resp-{n}", tenant_id=tenant, sealed=b"\0",
                       expires_at=NOW + timedelta(days=1)),
        EventRun(response_id=f"resp-{n}", first=0, until=1, tenant_id=tenant, sealed=b"\0"),
        Conversation(id=f"conv_{n}", tenant_id=tenant, sealed=b"\0"),
        StoredChat(id=f"chatcmpl-{n}", tenant_id=tenant, model="m", sealed=b"\0",
                   expires_at=NOW + timedelta(days=1)),
        ConversationItem(conversation_id=f"conv_{n}", id=f"msg_{n}", tenant_id=tenant,
                         sealed=b"\0"),
        hook,
        delivery,
        WebhookAttempt(tenant_id=tenant, delivery_id=delivery.id, outcome="error", duration_ms=1.0),
    ]
    # fmt: on


@pytest.fixture(scope="module")
async def seeded(database_uri: str) -> tuple[list[str], uuid.UUID, uuid.UUID]:
    """Rows of two tenants in every tenant table, written by the owner; yields the tables."""
    owner = create_engine(asyncpg_url(database_uri), pool_size=1)
    a, b = uuid.uuid4(), uuid.uuid4()
    async with sessionmaker(owner).begin() as session:
        tables = ["tenants", *(await session.scalars(TENANT_TABLES)).all()]
        model = Model(name=f"rls-model-{a.hex[:6]}", task="embed")
        session.add(model)
        await session.flush()
        seeded = {}
        for tenant in (a, b):
            for row in _rows(tenant, model.id):
                session.add(row)
                await session.flush()
                seeded[row.__tablename__] = True
    await owner.dispose()
    missing = set(tables) - set(seeded)
    assert not missing, f"tenant tables without a seed row here: {sorted(missing)}"
    return tables, a, b


async def _counts(conn: AsyncConnection, tables: list[str]) -> dict[str, int]:
    return {t: await conn.scalar(text(f"SELECT count(*) FROM {t}")) or 0 for t in tables}  # noqa: S608


async def _tenants(conn: AsyncConnection, tables: list[str]) -> dict[str, set[str]]:
    column: Callable[[str], str] = lambda t: "id" if t == "tenants" else "tenant_id"  # noqa: E731
    return {
        t: set((await conn.scalars(text(f"SELECT DISTINCT {column(t)}::text FROM {t}"))).all())  # noqa: S608
        for t in tables
    }


async def test_app_role_sees_nothing_without_a_declared_tenant_or_scope(
    seeded: tuple[list[str], uuid.UUID, uuid.UUID], database_uri: str
) -> None:
    tables, a, b = seeded
    assert len(tables) >= 14
    owner = create_engine(asyncpg_url(database_uri), pool_size=1)
    async with owner.connect() as conn:
        unforced = await conn.scalar(
            text("SELECT count(*) FROM pg_class WHERE relname = ANY(:t)"
                 " AND relkind = 'r' AND NOT (relrowsecurity AND relforcerowsecurity)"),
            {"t": tables},
        )  # fmt: skip
    await owner.dispose()
    assert unforced == 0
    settings = Settings(data_dir=Path("/nonexistent"), database_url=database_uri)
    async with open_database(settings, upgrade=False) as db, db.engine.connect() as conn:
        async with conn.begin():
            assert await conn.scalar(text("SELECT current_user")) == APP_ROLE
        async with conn.begin():  # forgot to say whose rows: none
            assert await _counts(conn, tables) == dict.fromkeys(tables, 0)
        async with conn.begin():
            await conn.execute(text("SELECT set_config('kiln.tenant_id', :t, true)"), {"t": str(a)})
            assert await _tenants(conn, tables) == {t: {str(a)} for t in tables}
        async with conn.begin():
            await conn.execute(text("SELECT set_config('kiln.scope', 'platform', true)"))
            seen = await _tenants(conn, tables)
            assert all({str(a), str(b)} <= seen[t] for t in tables), seen
        async with conn.begin():  # the scope was local to its transaction
            assert await _counts(conn, tables) == dict.fromkeys(tables, 0)
            with pytest.raises(Exception, match="row-level security"):
                await conn.execute(  # nor may it write a row it could not see
                    text("INSERT INTO quotas (id, tenant_id) VALUES (gen_random_uuid(), :t)"),
                    {"t": a},
                )


async def test_platform_sessions_declare_scope_and_kiln_tenant_ignores_it(
    seeded: tuple[list[str], uuid.UUID, uuid.UUID], database_uri: str
) -> None:
    _, a, b = seeded
    settings = Settings(data_dir=Path("/nonexistent"), database_url=database_uri)
    async with open_database(settings, upgrade=False) as db:
        async with db.sessions() as session:  # the platform session factory
            ids = set((await session.scalars(text("SELECT id FROM tenants"))).all())
            assert {a, b} <= ids
        async with db.sessions.begin() as session:  # scope declared, but as kiln_tenant
            await session.execute(text("SET LOCAL ROLE kiln_tenant"))
            assert await session.scalar(text("SELECT count(*) FROM api_keys")) == 0
            await session.execute(
                text("SELECT set_config('kiln.tenant_id', :t, true)"), {"t": str(a)}
            )
            owners = set((await session.scalars(text("SELECT tenant_id FROM api_keys"))).all())
            assert owners == {a}


async def test_app_role_owns_nothing_and_cannot_change_schema(database_uri: str) -> None:
    engine = create_engine(asyncpg_url(database_uri), role=APP_ROLE)
    try:
        async with engine.connect() as conn, conn.begin():
            privileged = await conn.scalar(
                text("SELECT rolsuper OR rolbypassrls FROM pg_roles WHERE rolname = current_user")
            )
            owned = await conn.scalar(
                text("SELECT count(*) FROM pg_tables WHERE tableowner = current_user")
            )
            assert (privileged, owned) == (False, 0)
        async with engine.connect() as conn:
            for ddl in ("ALTER TABLE quotas NO FORCE ROW LEVEL SECURITY",
                        "CREATE TABLE rls_probe (id int)", "DROP POLICY platform_scope ON quotas",
                        "UPDATE alembic_version SET version_num = 'x'"):  # fmt: skip
                async with conn.begin():
                    with pytest.raises(Exception, match=r"must be owner|permission denied"):
                        await conn.execute(text(ddl))
    finally:
        await engine.dispose()


async def test_refuses_to_serve_as_a_role_rls_does_not_bind(database_uri: str) -> None:
    engine = create_engine(asyncpg_url(database_uri))  # the embedded server's superuser
    try:
        with pytest.raises(UnsafeDatabaseRole, match="KILN_DATABASE_OWNER_URL"):
            await check_app_role(engine)
    finally:
        await engine.dispose()


async def test_admin_api_still_confines_tenant_actors(admin: Admin, root: str) -> None:
    a = await admin.tenant(root, "rls-a")
    b = await admin.tenant(root, "rls-b")
    key_a = await admin.key(root, a, role="tenant-admin", scopes=["admin:read", "admin:write"])
    r = await admin.call("GET", "/admin/v1/tenants", key_a)
    assert r.status_code == 200, r.text
    assert [t["id"] for t in r.json()] == [a]
    assert (await admin.call("GET", f"/admin/v1/tenants/{b}", key_a)).status_code == 404


async def test_embedded_server_app_logs_in_as_kiln_app(tmp_path: Path) -> None:
    """No database configured: migrations run as the embedded superuser, the app logs in as
    ``kiln_app`` itself (its session user, so no ``RESET ROLE`` can lift the wall)."""
    settings = Settings(data_dir=tmp_path / "data")
    async with open_database(settings) as db, db.engine.connect() as conn:
        users = (await conn.execute(text("SELECT session_user, current_user"))).one()
        assert tuple(users) == (APP_ROLE, APP_ROLE)
        assert db.engine.url.username == APP_ROLE
        assert db.engine.url.password == app_password(settings.hmac_key())


async def test_owner_url_migrates_and_the_app_logs_in_as_kiln_app(database_uri: str) -> None:
    """An external database: the operator made ``kiln_app`` a login role; Kiln migrates through
    ``KILN_DATABASE_OWNER_URL`` and serves through ``KILN_DATABASE_URL`` as ``kiln_app``."""
    owner = create_engine(asyncpg_url(database_uri), pool_size=1)
    async with owner.begin() as conn:
        await conn.execute(text(f"ALTER ROLE {APP_ROLE} LOGIN"))
    await owner.dispose()
    app_url = make_url(database_uri).set(username=APP_ROLE).render_as_string(hide_password=False)
    settings = Settings(
        data_dir=Path("/nonexistent"), database_url=app_url, database_owner_url=database_uri
    )
    async with open_database(settings) as db, db.engine.connect() as conn:
        users = (await conn.execute(text("SELECT session_user, current_user"))).one()
        assert tuple(users) == (APP_ROLE, APP_ROLE)
