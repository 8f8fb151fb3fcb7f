"""The idempotency store against a real PostgreSQL: claim, replay, mismatch, concurrency,
lapsed locks, expiry and pruning, and bodies sealed at rest."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from sqlalchemy import func, select

from kiln_platform.billing.tables import IdempotencyKey
from kiln_platform.db.database import Database
from kiln_platform.errors import Conflict, IdempotencyInProgress, IdempotencyKeyReused
from kiln_platform.idempotency.services import IdempotencyStore, KeyScope, StoredResponse
from kiln_platform.tenants.services import insert_tenant

SECRET = b"idempotency-test-secret"
ANSWER = StoredResponse(201, {"content-type": "application/json"}, b'{"secret":"kiln_x_abc"}')


@pytest.fixture(scope="module")
async def tenant_id(db: Database) -> uuid.UUID:
    async with db.sessions.begin() as session:
        return (await insert_tenant(session, "idem-co")).id


def _store(db: Database, *, ttl_s: float = 3600, lock_s: float = 30) -> IdempotencyStore:
    return IdempotencyStore(db.sessions, SECRET, ttl_s=ttl_s, lock_s=lock_s)


def _scope(
    tenant_id: uuid.UUID, key: str = "", credential: str = "key:k1", path: str = "/v1/embeddings"
) -> KeyScope:
    return KeyScope(tenant_id, credential, "POST", path, key or uuid.uuid4().hex)


async def _row(db: Database, where: KeyScope) -> IdempotencyKey | None:
    async with db.sessions() as session:
        return await session.scalar(select(IdempotencyKey).where(*where.where()))


async def test_claim_then_replay_the_stored_response(db: Database, tenant_id: uuid.UUID) -> None:
    store, where = _store(db), _scope(tenant_id)
    assert await store.claim(where, b"f" * 32, "req_1") is None
    with pytest.raises(IdempotencyInProgress) as running:
        await store.claim(where, b"f" * 32, "req_2")
    assert running.value.retry_after == 1.0
    await store.complete(where, "req_1", ANSWER)
    assert await store.claim(where, b"f" * 32, "req_3") == ANSWER
    row = await _row(db, where)
    assert row is not None
    assert row.request_id == "req_1"
    assert row.locked_until is None
    assert row.body is not None
    assert b"kiln_x_abc" not in row.body  # sealed at rest


async def test_same_key_with_another_body_is_refused(db: Database, tenant_id: uuid.UUID) -> None:
    store, where = _store(db), _scope(tenant_id)
    assert await store.claim(where, b"a" * 32, "req_a") is None
    with pytest.raises(IdempotencyKeyReused) as reused:  # while running
        await store.claim(where, b"b" * 32, "req_b")
    assert reused.value.param == "Idempotency-Key"
    await store.complete(where, "req_a", ANSWER)
    with pytest.raises(IdempotencyKeyReused):  # and once stored
        await store.claim(where, b"b" * 32, "req_c")


async def test_scope_separates_credentials_and_paths(db: Database, tenant_id: uuid.UUID) -> None:
    store, key = _store(db), "shared-key"
    first = _scope(tenant_id, key)
    assert await store.claim(first, b"a" * 32, "r1") is None
    other_key = _scope(tenant_id, key, credential="key:k2")
    other_path = _scope(tenant_id, key, path="/v1/completions")
    assert await store.claim(other_key, b"a" * 32, "r2") is None
    assert await store.claim(other_path, b"a" * 32, "r3") is None
    with pytest.raises(IdempotencyInProgress):
        await store.claim(first, b"a" * 32, "r4")


async def test_released_key_runs_again(db: Database, tenant_id: uuid.UUID) -> None:
    store, where = _store(db), _scope(tenant_id)
    assert await store.claim(where, b"f" * 32, "req_1") is None
    await store.release(where, "req_1")
    assert await _row(db, where) is None
    assert await store.claim(where, b"g" * 32, "req_2") is None  # a fresh start, any body


async def test_concurrent_claims_have_exactly_one_winner(
    db: Database, tenant_id: uuid.UUID
) -> None:
    stores = [_store(db) for _ in range(4)]  # as if four gateway processes
    where = _scope(tenant_id)

    async def claim(i: int) -> str:
        try:
            result = await stores[i % 4].claim(where, b"f" * 32, f"req_{i}")
        except IdempotencyInProgress:
            return "409"
        return "won" if result is None else "replayed"

    outcomes = await asyncio.gather(*(claim(i) for i in range(40)))
    assert outcomes.count("won") == 1
    assert outcomes.count("409") == 39


async def test_lock_of_a_killed_request_lapses(db: Database, tenant_id: uuid.UUID) -> None:
    store, where = _store(db, lock_s=0.3), _scope(tenant_id)
    assert await store.claim(where, b"f" * 32, "req_dead") is None  # its process then dies
    with pytest.raises(IdempotencyInProgress):
        await store.claim(where, b"f" * 32, "req_early")
    await asyncio.sleep(0.5)
    assert await store.claim(where, b"f" * 32, "req_retry") is None
    await store.complete(where, "req_dead", ANSWER)  # a late writer no longer owns the key
    row = await _row(db, where)
    assert row is not None
    assert (row.request_id, row.status) == ("req_retry", None)


async def test_renewal_keeps_a_long_request_locked(db: Database, tenant_id: uuid.UUID) -> None:
    store, where = _store(db, lock_s=0.4), _scope(tenant_id)
    assert await store.claim(where, b"f" * 32, "req_long") is None
    for _ in range(4):
        await asyncio.sleep(0.2)
        await store.renew(where, "req_long")
    with pytest.raises(IdempotencyInProgress):
        await store.claim(where, b"f" * 32, "req_dup")


async def test_expired_keys_are_reusable_and_pruned(db: Database, tenant_id: uuid.UUID) -> None:
    short, where = _store(db, ttl_s=0.3), _scope(tenant_id)
    assert await short.claim(where, b"a" * 32, "req_1") is None
    await short.complete(where, "req_1", ANSWER)
    kept = _scope(tenant_id)
    assert await _store(db).claim(kept, b"a" * 32, "req_kept") is None
    await asyncio.sleep(0.5)
    assert await short.claim(where, b"b" * 32, "req_2") is None  # expired: a new request
    await short.complete(where, "req_2", ANSWER)
    await asyncio.sleep(0.5)
    async with db.sessions() as session:
        expired = await session.scalar(
            select(func.count())
            .select_from(IdempotencyKey)
            .where(IdempotencyKey.expires_at <= func.now())
        )
    assert expired is not None
    assert expired >= 1
    assert await short.prune() == expired
    assert await _row(db, where) is None
    assert await _row(db, kept) is not None


async def test_a_sealed_body_cannot_be_moved_to_another_row(
    db: Database, tenant_id: uuid.UUID
) -> None:
    store, a, b = _store(db), _scope(tenant_id), _scope(tenant_id)
    for where, rid in ((a, "ra"), (b, "rb")):
        assert await store.claim(where, b"f" * 32, rid) is None
        await store.complete(where, rid, ANSWER)
    row_a = await _row(db, a)
    assert row_a is not None
    async with db.sessions.begin() as session:
        row_b = await session.scalar(select(IdempotencyKey).where(*b.where()))
        assert row_b is not None
        row_b.body = row_a.body
    with pytest.raises(Conflict) as unreadable:
        await store.claim(b, b"f" * 32, "rc")
    assert not isinstance(unreadable.value, IdempotencyInProgress)  # no point retrying it
