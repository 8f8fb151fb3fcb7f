"""Rotating database credentials on the suite's real PostgreSQL: the password changes (role
and mounted file) while the app's database is open, and new connections log in with the new
one, no restart. The embedded server trusts local logins, so this module's role alone is made
to need a password (a ``pg_hba.conf`` line, removed afterwards)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

import asyncpg
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from kiln_platform.db.credentials import IAM_TOKEN_REUSE_S, IamTokens
from kiln_platform.db.database import open_database
from kiln_platform.db.engine import APP_ROLE, asyncpg_url, create_engine, writer_engine
from kiln_platform.settings import Settings

if TYPE_CHECKING:
    from collections.abc import Iterator

ROLE = "kiln_rotating"


async def _superuser(pg_uri: str, *statements: str) -> str:
    conn = await asyncpg.connect(pg_uri)
    try:
        for statement in statements:
            await conn.execute(statement)
        hba: str = await conn.fetchval("SHOW hba_file")
        return hba
    finally:
        await conn.close()


@pytest.fixture(scope="module")
def rotating_role(pg_uri: str) -> Iterator[None]:
    """A login role in ``kiln_app`` that must give its password (scram), cluster-wide."""
    hba = Path(asyncio.run(_superuser(pg_uri, f"CREATE ROLE {ROLE} LOGIN IN ROLE {APP_ROLE}")))
    original = hba.read_text()
    rules = f"local all {ROLE} scram-sha-256\nhost all {ROLE} all scram-sha-256\n"
    hba.write_text(rules + original)  # first match wins: only this role is affected
    asyncio.run(_superuser(pg_uri, "SELECT pg_reload_conf()"))
    yield
    hba.write_text(original)
    asyncio.run(_superuser(pg_uri, "SELECT pg_reload_conf()", f"DROP ROLE {ROLE}"))


async def _set_password(database_uri: str, password: str) -> None:
    await _superuser(database_uri, f"ALTER ROLE {ROLE} PASSWORD '{password}'")


async def _whoami(engine: object) -> str | None:
    async with engine.connect() as conn:  # type: ignore[attr-defined]
        user: str | None = await conn.scalar(text("SELECT session_user"))
        return user


@pytest.mark.usefixtures("rotating_role")
async def test_a_rotated_password_file_is_used_by_new_connections(
    database_uri: str, tmp_path: Path
) -> None:
    password = tmp_path / "password"
    password.write_text("first-password\n")
    await _set_password(database_uri, "first-password")
    app_url = make_url(database_uri).set(username=ROLE, password="stale-in-the-url")
    settings = Settings(
        data_dir=tmp_path, database_owner_url=database_uri,
        database_url=app_url.render_as_string(hide_password=False),
        database_password_file=password,
    )  # fmt: skip
    async with open_database(settings) as db:
        ledger = writer_engine(db.engine, db.set_role, password=db.password)
        try:
            assert await _whoami(db.engine) == ROLE
            assert await _whoami(ledger) == ROLE
            async with db.engine.connect() as held:  # open across the rotation
                await _set_password(database_uri, "second-password")
                with pytest.raises(Exception, match="password authentication failed"):
                    await _whoami(db.engine)  # the role rotated, the file not yet
                password.write_text("second-password\n")
                assert await _whoami(db.engine) == ROLE  # a new connection, the new password
                assert await held.scalar(text("SELECT session_user")) == ROLE
            await db.engine.dispose()  # every pooled connection replaced
            await ledger.dispose()
            assert await _whoami(db.engine) == ROLE
            assert await _whoami(ledger) == ROLE
        finally:
            await ledger.dispose()


@pytest.mark.usefixtures("rotating_role")
async def test_iam_tokens_reach_asyncpg_as_the_connections_password(database_uri: str) -> None:
    """The IAM path's plumbing, with a signer that hands out the role's password as the token:
    asyncpg awaits the source (signed in a thread) at each connect, reused until it expires."""
    await _set_password(database_uri, "token-1")
    signed: list[str] = []

    def sign(host: str, port: int, user: str) -> str:
        signed.append(user)
        return f"token-{len(signed)}"

    now = [0.0]
    tokens = IamTokens(sign, "db.example.internal", 5432, ROLE, clock=lambda: now[0])
    url = make_url(database_uri).set(username=ROLE).render_as_string(hide_password=False)
    engine = create_engine(asyncpg_url(url), pool_size=1, password=tokens)
    try:
        assert await _whoami(engine) == ROLE
        await engine.dispose()
        assert await _whoami(engine) == ROLE  # a new connection, the same token
        assert signed == [ROLE]
        await _set_password(database_uri, "token-2")
        now[0] = IAM_TOKEN_REUSE_S  # the first token is too old to hand out
        await engine.dispose()
        assert await _whoami(engine) == ROLE
        assert signed == [ROLE, ROLE]
    finally:
        await engine.dispose()
