"""Keys, tenants, registry and migrations against a real PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select, text, update

from kiln_platform.db.database import Database
from kiln_platform.db.tables import ApiKey
from kiln_platform.errors import Conflict, Unauthorized
from kiln_platform.keys.services import KeyVerifier, insert_key
from kiln_platform.registry.resolver import Resolver
from kiln_platform.registry.services import register_version
from kiln_platform.tenants.services import insert_tenant
from kiln_runtimes.protocol import ModelManifest

HMAC_KEY = b"test-secret"


async def test_migrations_are_current_and_idempotent(db: Database) -> None:
    from kiln_platform.db import migrate

    await migrate.upgrade(db.engine)  # a second run changes nothing
    assert await migrate.is_current(db.engine)


async def test_duplicate_tenant_is_a_conflict_and_leaves_one_row(db: Database) -> None:
    async with db.sessions.begin() as session:
        await insert_tenant(session, "dup-co")
    with pytest.raises(Conflict):
        async with db.sessions.begin() as session:
            await insert_tenant(session, "dup-co")
    async with db.sessions() as session:
        count = await session.scalar(text("SELECT count(*) FROM tenants WHERE name = 'dup-co'"))
    assert count == 1


async def test_key_is_stored_as_keyed_hash_and_verifies(db: Database) -> None:
    async with db.sessions.begin() as session:
        tenant = await insert_tenant(session, "keys-co")
        key, secret = await insert_key(session, HMAC_KEY, tenant.id, name="ci")
    async with db.sessions() as session:
        row = await session.scalar(select(ApiKey).where(ApiKey.id == key.id))
    assert row is not None
    assert secret.encode() not in row.digest
    assert secret[14:].encode() not in row.digest
    assert secret.startswith(row.prefix + "_")
    verifier = KeyVerifier(db.sessions, HMAC_KEY, ttl=0.0)
    principal = await verifier.verify(secret)
    assert principal.tenant_id == tenant.id
    for bad in (secret + "x", secret[:-1], "kiln_00000000_nope", "sk-abc", ""):
        with pytest.raises(Unauthorized):
            await verifier.verify(bad)
    with pytest.raises(Unauthorized):  # a different server secret never matches
        await KeyVerifier(db.sessions, b"other", ttl=0.0).verify(secret)


async def test_revoked_and_expired_keys_are_refused(db: Database) -> None:
    async with db.sessions.begin() as session:
        tenant = await insert_tenant(session, "revoke-co")
        revoked, revoked_secret = await insert_key(session, HMAC_KEY, tenant.id)
        _, expired_secret = await insert_key(
            session, HMAC_KEY, tenant.id, expires_at=datetime.now(UTC) - timedelta(seconds=1)
        )
    verifier = KeyVerifier(db.sessions, HMAC_KEY, ttl=0.0)
    await verifier.verify(revoked_secret)
    async with db.sessions.begin() as session:
        await session.execute(
            update(ApiKey).where(ApiKey.id == revoked.id).values(revoked_at=datetime.now(UTC))
        )
    for secret in (revoked_secret, expired_secret):
        with pytest.raises(Unauthorized):
            await verifier.verify(secret)


async def test_register_version_is_idempotent_and_resolves_newest(db: Database) -> None:
    manifest = ModelManifest(name="m1", task="embeddings", engine="onnxruntime", dimensions=4)
    async with db.sessions.begin() as session:
        assert await register_version(session, manifest, "1", "sha256:" + "a" * 64)
    async with db.sessions.begin() as session:
        assert not await register_version(session, manifest, "1", "sha256:" + "b" * 64)
    async with db.sessions.begin() as session:
        assert await register_version(session, manifest, "2", "sha256:" + "c" * 64)
    resolved = await Resolver(db.sessions).resolve("m1")
    assert (resolved.version, resolved.artifact_digest) == ("2", "sha256:" + "c" * 64)
    assert resolved.manifest == manifest
