"""Console fixtures: the real app on a fresh database, served in-process over ASGI, with users
made the way ``kiln users create`` makes them."""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import httpx
import pytest
from pydantic import SecretStr

from kiln_console.compose import create_app
from kiln_platform.context import Kiln
from kiln_platform.settings import Settings
from kiln_platform.users.schemas import UserCreate
from kiln_platform.users.services import create_user
from tests.asgi import asgi
from tests.factories import CLI, make_tenant

from ..conftest import serving

PASSWORD = "correct horse battery"
_CSRF = re.compile(r'name="_csrf_token" value="([^"]+)"')


@dataclass
class App:
    """The running app and helpers to make tenants, users and signed-in browsers."""

    kiln: Kiln
    transport: httpx.ASGITransport

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=self.transport, base_url="http://127.0.0.1")

    async def tenant(self) -> uuid.UUID:
        async with self.kiln.db.sessions.begin() as session:
            return await make_tenant(session)

    async def user(self, role: str, tenant: uuid.UUID | None = None) -> str:
        email = f"{role}-{uuid.uuid4().hex[:8]}@example.com"
        data = UserCreate(email=email, password=PASSWORD, role=role, tenant_id=tenant)  # type: ignore[arg-type]
        async with self.kiln.db.sessions.begin() as session:
            await create_user(session, CLI, data)
        return email

    @asynccontextmanager
    async def signed_in(self, email: str) -> AsyncIterator[tuple[httpx.AsyncClient, str]]:
        """A client with a console session, and its CSRF token."""
        async with self.client() as http:
            token = csrf(await http.get("/console/login"))
            r = await http.post("/console/login", data={"email": email, "password": PASSWORD,
                                                        "_csrf_token": token})  # fmt: skip
            assert r.status_code == 303, r.text
            yield http, http.cookies["kiln_csrf"]  # sign-in issues the session its own token


def csrf(page: httpx.Response) -> str:
    """The CSRF token a console page carries."""
    found = _CSRF.search(page.text)
    assert found, page.text
    return found.group(1)


@pytest.fixture(scope="module")
def settings(database_uri: str, tmp_path_factory: pytest.TempPathFactory) -> Settings:
    return Settings(data_dir=tmp_path_factory.mktemp("data"), database_url=database_uri,
                    secret_key=SecretStr("console-test-secret"), key_cache_ttl_s=0.0)  # fmt: skip


@pytest.fixture(scope="module")
async def app(settings: Settings) -> AsyncIterator[App]:
    litestar = create_app(settings)
    async with serving(litestar):
        yield App(
            litestar.state.kiln, httpx.ASGITransport(app=asgi(litestar), client=("127.0.0.1", 1))
        )
