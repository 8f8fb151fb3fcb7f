"""OAuth fixtures: the real app on a fresh database (served in-process over ASGI), tenants and
clients made the way ``kiln oauth-clients create`` makes them."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import httpx2
import pytest
from pydantic import SecretStr

from kiln_console.compose import create_app
from kiln_platform.context import Kiln
from kiln_platform.oauth import services
from kiln_platform.oauth.schemas import ClientCreate
from kiln_platform.settings import Settings
from tests.asgi import asgi
from tests.factories import CLI, make_tenant

from ..conftest import serving

BASE = "http://127.0.0.1"  # authlib refuses plain http except on loopback


@dataclass
class App:
    """The running app, an ASGI transport to it, and helpers."""

    kiln: Kiln
    transport: httpx.ASGITransport
    oauth_transport: httpx2.ASGITransport
    """The same app for authlib's OAuth2 client, which is built on httpx2."""

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=self.transport, base_url=BASE)

    async def tenant(self) -> uuid.UUID:
        async with self.kiln.db.sessions.begin() as session:
            return await make_tenant(session)

    async def oauth_client(self, tenant: uuid.UUID, *scopes: str) -> tuple[str, str]:
        data = ClientCreate(name="test", scopes=list(scopes or ("inference",)))  # type: ignore[arg-type]
        async with self.kiln.db.sessions.begin() as session:
            made = await services.create_client(
                session, CLI, tenant, data, self.kiln.settings.hmac_key()
            )
        return made.client.client_id, made.client_secret


@pytest.fixture(scope="module")
def settings(database_uri: str, tmp_path_factory: pytest.TempPathFactory) -> Settings:
    return Settings(
        data_dir=tmp_path_factory.mktemp("data"), database_url=database_uri,
        secret_key=SecretStr("oauth-test-secret"), key_cache_ttl_s=0.0,
    )  # fmt: skip


@pytest.fixture(scope="module")
async def app(settings: Settings) -> AsyncIterator[App]:
    litestar = create_app(settings)
    async with serving(litestar):
        peer = ("127.0.0.1", 1)
        yield App(
            litestar.state.kiln,
            httpx.ASGITransport(app=asgi(litestar), client=peer),
            httpx2.ASGITransport(app=asgi(litestar), client=peer),
        )


@pytest.fixture
def bearer() -> Callable[[str], dict[str, Any]]:
    return lambda token: {"authorization": f"Bearer {token}"}
