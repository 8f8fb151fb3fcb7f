"""Key rotation and usage per key against a real PostgreSQL: one step, one audit record per
key, the old key verified until its overlap ends, and per-day counts read by index."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select, text

from kiln_platform.admin.authz import Actor, Role
from kiln_platform.db.database import Database
from kiln_platform.db.tables import AuditRecord, UsageEvent
from kiln_platform.errors import Conflict, Forbidden, NotFound, Unauthorized
from kiln_platform.keys import usage
from kiln_platform.keys.services import KeyVerifier, insert_key, revoke_key, rotate_key
from kiln_platform.tenants.services import insert_tenant

HMAC_KEY = b"test-secret"


async def test_rotation_replaces_a_key_and_schedules_the_old_one(db: Database) -> None:
    async with db.sessions.begin() as session:
        tenant = await insert_tenant(session, "rotate-co")
        old, old_secret = await insert_key(
            session, HMAC_KEY, tenant.id, name="ci", scopes=frozenset({"inference", "admin:read"})
        )
    admin = Actor("user:a@rotate.co", Role.TENANT_ADMIN, tenant.id)
    async with db.sessions.begin() as session:
        made = await rotate_key(session, admin, tenant.id, old.id, overlap_s=3600,
                                hmac_key=HMAC_KEY)  # fmt: skip
    assert (made.key.name, made.key.scopes, made.key.role) == ("ci", ["admin:read", "inference"],
                                                               "tenant-admin")  # fmt: skip
    assert made.replaces.expires_at is not None
    left = made.replaces.expires_at - datetime.now(UTC)
    assert timedelta(minutes=59) < left <= timedelta(hours=1)
    verifier = KeyVerifier(db.sessions, HMAC_KEY, ttl=0.0)
    assert (await verifier.verify(old_secret)).key_id == old.id  # during the overlap
    assert (await verifier.verify(made.secret)).key_id == made.key.id
    async with db.sessions() as session:
        rows = await session.execute(
            select(AuditRecord.action, AuditRecord.target_id).where(
                AuditRecord.tenant_id == tenant.id
            )
        )
        actions = [tuple(r) for r in rows]
    assert sorted(actions) == [("key.create", str(made.key.id)), ("key.rotate", str(old.id))]

    cached = KeyVerifier(db.sessions, HMAC_KEY, ttl=60.0)
    await cached.verify(made.secret)
    async with db.sessions.begin() as session:  # overlap 0: the new key's twin, refused now
        again = await rotate_key(session, admin, tenant.id, made.key.id, overlap_s=0,
                                 hmac_key=HMAC_KEY)  # fmt: skip
    with pytest.raises(Unauthorized):
        await verifier.verify(made.secret)
    await cached.verify(made.secret)  # a cached principal lives until the TTL...
    cached.forget(made.key.id)
    with pytest.raises(Unauthorized):  # ...unless the process that changed the key forgets it
        await cached.verify(made.secret)
    await verifier.verify(again.secret)
    await verifier.verify(old_secret)  # its own overlap still runs


async def test_rotation_is_refused_for_dead_keys_members_and_other_tenants(db: Database) -> None:
    async with db.sessions.begin() as session:
        tenant = await insert_tenant(session, "rotate-refused")
        key, _ = await insert_key(session, HMAC_KEY, tenant.id)
    member = Actor("user:m@x.co", Role.TENANT_MEMBER, tenant.id)
    stranger = Actor("user:s@y.co", Role.TENANT_ADMIN, (await _tenant(db, "rotate-stranger")))
    admin = Actor("user:a@x.co", Role.TENANT_ADMIN, tenant.id)
    for actor, error in ((member, Forbidden), (stranger, NotFound)):
        with pytest.raises(error):
            async with db.sessions.begin() as session:
                await rotate_key(session, actor, tenant.id, key.id, overlap_s=0,
                                 hmac_key=HMAC_KEY)  # fmt: skip
    async with db.sessions.begin() as session:
        await revoke_key(session, admin, str(key.id), HMAC_KEY, tenant.id)
    with pytest.raises(Conflict):
        async with db.sessions.begin() as session:
            await rotate_key(session, admin, tenant.id, key.id, overlap_s=0, hmac_key=HMAC_KEY)


async def _tenant(db: Database, name: str) -> uuid.UUID:
    async with db.sessions.begin() as session:
        return (await insert_tenant(session, name)).id


async def test_requests_per_key_per_day_come_from_the_index(db: Database) -> None:
    now = datetime.now(UTC)
    async with db.sessions.begin() as session:
        tenant = await insert_tenant(session, "usage-co")
        key, _ = await insert_key(session, HMAC_KEY, tenant.id)
        idle, _ = await insert_key(session, HMAC_KEY, tenant.id)
        for n, days_ago in enumerate((0, 0, 2, 8)):  # the 8-day-old one is out of the window
            session.add(UsageEvent(
                request_id=f"usage-co-{n}", tenant_id=tenant.id, api_key_id=key.id, model="m",
                version="1", endpoint="embeddings", status=200,
                created_at=now - timedelta(days=days_ago),
            ))  # fmt: skip
    async with db.sessions() as session:
        daily = await usage.daily_requests(session, [key.id, idle.id])
        await session.execute(text("SET LOCAL enable_seqscan = off"))
        query = usage.daily_query([key.id], now - timedelta(days=7))
        compiled = query.compile(db.engine.sync_engine, compile_kwargs={"literal_binds": True})
        plan = "\n".join((await session.execute(text(f"EXPLAIN {compiled}"))).scalars())
    assert daily[key.id].requests == (0, 0, 0, 0, 1, 0, 2)  # oldest day first
    assert len(daily[key.id].days) == 7
    assert daily[idle.id].total == 0
    assert "ix_usage_events_key_created" in plan, plan
