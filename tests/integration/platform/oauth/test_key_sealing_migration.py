"""Migration 0010 seals the plaintext signing keys an older database holds: afterwards no column
holds the PEM, and the server secret opens what is there to the same key."""

from __future__ import annotations

import uuid

import asyncpg
import pytest
from joserfc.jwk import RSAKey
from sqlalchemy import text

from kiln_platform.db import migrate
from kiln_platform.db.engine import asyncpg_url, create_engine
from kiln_platform.oauth.keys import key_seal

SECRET = b"migration-test-secret"


async def _empty_database(pg_uri: str) -> str:
    name = f"m_{uuid.uuid4().hex[:12]}"
    conn = await asyncpg.connect(pg_uri)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    base, _, query = pg_uri.partition("?")
    return f"{base.rsplit('/', 1)[0]}/{name}" + (f"?{query}" if query else "")


async def test_plaintext_keys_are_sealed_by_the_migration(pg_uri: str) -> None:
    engine = create_engine(asyncpg_url(await _empty_database(pg_uri)), pool_size=1)
    try:
        await migrate.upgrade(engine, revision="0008")
        key = RSAKey.generate_key(2048, private=True)
        pem = key.as_pem(private=True).decode()
        async with engine.begin() as conn:
            await conn.execute(
                text("INSERT INTO oauth_signing_keys (kid, private_pem) VALUES (:k, :p)"),
                {"k": key.thumbprint(), "p": pem},
            )
        with pytest.raises(RuntimeError, match="needs the secret"):  # rows, and no secret
            await migrate.upgrade(engine)
        await migrate.upgrade(engine, SECRET)
        async with engine.connect() as conn:
            rows = (await conn.execute(text("SELECT * FROM oauth_signing_keys"))).mappings().all()
        assert len(rows) == 1
        row = rows[0]
        assert "private_pem" not in row
        assert b"PRIVATE KEY" not in row["private_sealed"]
        opened = key_seal(SECRET).open(row["private_sealed"], key.thumbprint().encode())
        assert opened.decode() == pem
    finally:
        await engine.dispose()
