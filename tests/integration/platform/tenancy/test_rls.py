"""Row-level security, the second wall: through the application's tenant role, a session without
a tenant context sees no tenant rows, and one with a context sees only its tenant's."""

from __future__ import annotations

from sqlalchemy import text

from .conftest import Admin

TABLES = ("tenants", "api_keys", "users", "quotas", "oauth_clients", "usage_events", "audit_log")


async def test_no_tenant_context_sees_no_tenant_rows(admin: Admin, root: str) -> None:
    a = await admin.tenant(root, "rls-a")
    await admin.tenant(root, "rls-b")
    await admin.key(root, a)
    async with admin.kiln.db.sessions.begin() as session:  # the owner (migrations) sees all
        assert await session.scalar(text("SELECT count(*) FROM tenants")) >= 2
    async with admin.kiln.db.sessions.begin() as session:
        await session.execute(text("SET LOCAL ROLE kiln_tenant"))
        for table in TABLES:
            assert await session.scalar(text(f"SELECT count(*) FROM {table}")) == 0, table  # noqa: S608
    async with admin.kiln.db.sessions.begin() as session:
        await session.execute(text("SET LOCAL ROLE kiln_tenant"))
        await session.execute(text("SELECT set_config('kiln.tenant_id', :t, true)"), {"t": a})
        ids = (await session.scalars(text("SELECT id::text FROM tenants"))).all()
        owners = (
            await session.scalars(text("SELECT DISTINCT tenant_id::text FROM api_keys"))
        ).all()
    assert list(ids) == [a]
    assert list(owners) == [a]
