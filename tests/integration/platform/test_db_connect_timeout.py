"""A network partition to PostgreSQL: connection attempts give up after the connect timeout.

The "server" here accepts TCP connections (the kernel completes the handshake from its listen
backlog) and never answers, as a database behind a partition that drops packets looks to a
client that connected before: asyncpg would wait its 60 s default for the start-up reply.
"""

from __future__ import annotations

import socket
import time
from typing import TYPE_CHECKING

import pytest
from sqlalchemy import text

from kiln_platform.db.database import open_database
from kiln_platform.db.engine import create_engine, sessionmaker
from kiln_platform.db.outage import unreachable
from kiln_platform.errors import ServiceUnavailable
from kiln_platform.keys.services import KeyVerifier
from kiln_platform.settings import Settings

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path


@pytest.fixture(scope="module")
def silent_server() -> Iterator[str]:
    """A URL whose server accepts connections and never says a word."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        port = listener.getsockname()[1]
        yield f"postgresql+asyncpg://kiln:pw@127.0.0.1:{port}/kiln"


async def test_a_connect_gives_up_after_the_timeout_as_unreachable(silent_server: str) -> None:
    engine = create_engine(silent_server, pool_size=1, connect_timeout_s=0.5)
    started = time.monotonic()
    try:
        with pytest.raises(Exception) as caught:  # noqa: PT011 (the kind is what is checked)
            async with engine.connect() as connection:
                await connection.execute(text("SELECT 1"))
    finally:
        await engine.dispose()
    assert time.monotonic() - started < 3.0
    assert unreachable(caught.value), caught.value


async def test_the_setting_reaches_the_app_engine(silent_server: str, tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, database_url=silent_server, db_connect_timeout_s=0.5)
    assert Settings(data_dir=tmp_path).db_connect_timeout_s == 5.0
    started = time.monotonic()
    with pytest.raises(Exception) as caught:  # noqa: PT011
        async with open_database(settings, upgrade=False):
            pass
    assert time.monotonic() - started < 3.0
    assert unreachable(caught.value), caught.value


async def test_an_unknown_key_is_refused_503_quickly_during_a_partition(silent_server: str) -> None:
    engine = create_engine(silent_server, pool_size=1, connect_timeout_s=0.5)
    verifier = KeyVerifier(sessionmaker(engine), b"k", ttl=1.0, outage_s=60.0)
    started = time.monotonic()
    try:
        with pytest.raises(ServiceUnavailable):
            await verifier.verify("kiln_abcd1234_0123456789abcdef0123456789")
    finally:
        await engine.dispose()
    assert time.monotonic() - started < 3.0
