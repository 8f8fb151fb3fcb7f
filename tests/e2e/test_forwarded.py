"""``KILN_FORWARDED_ALLOW_IPS`` on a real ``kiln up``: X-Forwarded-For and X-Forwarded-Proto are
believed from a trusted proxy (here 127.0.0.2) and ignored from anyone else (127.0.0.1), so a
client cannot pick the address the sign-in throttle and the audit log key on, nor the scheme
OAuth's https check sees."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from kiln_platform.db.database import open_database
from kiln_platform.db.tables import AuditRecord, SignInFailure
from kiln_platform.settings import Settings

from .conftest import PASSWORD, KilnProcess

PROXY, EMAIL = "127.0.0.2", "admin@proxy.test"
_CSRF = re.compile(r'name="_csrf_token" value="([^"]+)"')


@pytest.fixture(scope="module")
def kiln(
    start_kiln: Callable[..., KilnProcess],
    kiln_data_dir: Callable[[], AbstractContextManager[Path]],
) -> Iterator[KilnProcess]:
    with kiln_data_dir() as path:
        kiln = start_kiln(path, [], {"KILN_FORWARDED_ALLOW_IPS": PROXY})
        try:
            kiln.cli("users", "create", "--email", EMAIL, "--role", "platform-admin",
                     "--password", PASSWORD)  # fmt: skip
            yield kiln
        finally:
            if kiln.proc.poll() is None:
                kiln.stop()


def _client(kiln: KilnProcess, peer: str) -> httpx.Client:
    transport = httpx.HTTPTransport(local_address=peer)
    return httpx.Client(transport=transport, base_url=kiln.base_url, timeout=30)


def _sign_in(http: httpx.Client, password: str, forwarded_for: str) -> httpx.Response:
    token = _CSRF.search(http.get("/console/login").text)
    assert token
    form = {"email": EMAIL, "password": password, "_csrf_token": token.group(1)}
    return http.post("/console/login", data=form, headers={"x-forwarded-for": forwarded_for})


def _rows(kiln: KilnProcess) -> tuple[list[str], list[str | None]]:
    """The throttle's keys and the audited login sources, as the database holds them."""

    async def read() -> tuple[list[str], list[str | None]]:
        settings = Settings(data_dir=Path(kiln.env["KILN_DATA_DIR"]))
        async with open_database(settings) as db, db.sessions() as session:
            keys = await session.scalars(select(SignInFailure.key).order_by(SignInFailure.id))
            sources = await session.scalars(
                select(AuditRecord.source).where(AuditRecord.action == "user.login")
                .order_by(AuditRecord.id)
            )  # fmt: skip
            return list(keys), list(sources)

    return asyncio.run(read())


def test_forwarded_for_is_believed_only_from_a_trusted_proxy(kiln: KilnProcess) -> None:
    with _client(kiln, "127.0.0.1") as direct:  # not a trusted proxy: spoofing
        assert _sign_in(direct, "guess", "203.0.113.7").status_code == 401
        assert _sign_in(direct, PASSWORD, "203.0.113.7").status_code == 303
    with _client(kiln, PROXY) as proxy:  # the trusted proxy forwards the real client
        assert _sign_in(proxy, "guess", "198.51.100.9").status_code == 401
        assert _sign_in(proxy, PASSWORD, "198.51.100.9").status_code == 303
    keys, sources = _rows(kiln)
    assert "source:127.0.0.1" in keys
    assert "source:198.51.100.9" in keys
    assert "source:203.0.113.7" not in keys  # the spoofed address keyed nothing
    assert sources == ["127.0.0.1", "198.51.100.9"]


def test_forwarded_proto_decides_the_oauth_https_check_only_from_the_proxy(
    kiln: KilnProcess,
) -> None:
    form = {"grant_type": "client_credentials", "client_id": "nobody", "client_secret": "x"}
    headers = {"host": "kiln.example.com", "x-forwarded-proto": "https"}
    with _client(kiln, "127.0.0.1") as direct:
        r = direct.post("/oauth/token", data=form, headers=headers)
        assert r.json()["error"] == "insecure_transport", r.text  # still http to Kiln
    with _client(kiln, PROXY) as proxy:
        r = proxy.post("/oauth/token", data=form, headers=headers)
        assert r.json()["error"] == "invalid_client", r.text  # https: on to client auth
