"""Request bodies bounded before they are read, through the real app on a real PostgreSQL: an
ASGI ``receive`` that makes up a 512 MiB body on demand counts the bytes the app pulled, so
each test shows how much of an oversized body was read before the 413 (no 512 MiB in memory)."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from litestar import Litestar
from pydantic import SecretStr

from kiln_console.compose import create_app
from kiln_platform.body_limit import SMALL_BODY_BYTES
from kiln_platform.registry.services import register_version
from kiln_platform.settings import Settings
from kiln_runtimes.protocol import ModelManifest
from tests.factories import make_root_key

from .conftest import serving

JSON_LIMIT = 4 << 20
TENSOR_LIMIT = 8 << 20
UPLOAD_LIMIT = 6 << 20
HUGE = 512 << 20
CHUNK = 64 << 10


@dataclass
class Source:
    """A made-up request body of ``size`` bytes, handed out in ``CHUNK`` pieces on demand."""

    size: int
    pulled: int = 0
    _piece: bytes = field(default=b"x" * CHUNK, repr=False)

    async def receive(self) -> dict[str, Any]:
        if self.pulled >= self.size:
            return {"type": "http.disconnect"}
        piece = self._piece[: self.size - self.pulled]
        self.pulled += len(piece)
        return {"type": "http.request", "body": piece, "more_body": self.pulled < self.size}


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Server:
    app: Litestar
    key: str  # a platform-admin key with the inference scope
    model: str  # a registered tensor model (no worker: nothing must run)

    async def post(
        self, path: str, source: Source, headers: dict[str, str] | None = None
    ) -> Answer:
        """POST ``source`` to ``path`` with the key; no Content-Length unless ``headers`` say."""
        sent: list[dict[str, Any]] = []

        async def send(message: Any) -> None:
            sent.append(message)

        raw = {"authorization": f"Bearer {self.key}", "content-type": "application/json"}
        raw.update(headers or {})
        scope = {
            "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1", "method": "POST", "scheme": "http", "path": path,
            "raw_path": path.encode(), "query_string": b"", "root_path": "",
            "headers": [(k.encode(), v.encode()) for k, v in raw.items()],
            "client": ("127.0.0.1", 50000), "server": ("kiln.test", 80), "state": {},
        }  # fmt: skip
        await self.app(scope, source.receive, send)  # type: ignore[arg-type]
        start = next(m for m in sent if m["type"] == "http.response.start")
        body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
        names = {k.decode().lower(): v.decode() for k, v in start["headers"]}
        return Answer(start["status"], names, body)


@pytest.fixture(scope="module")
async def server(
    database_uri: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Server]:
    settings = Settings(
        data_dir=tmp_path_factory.mktemp("data"), database_url=database_uri,
        secret_key=SecretStr("body-limits-secret"), key_cache_ttl_s=0.0, pool_initial_replicas=0,
        max_json_body_bytes=JSON_LIMIT, max_tensor_body_bytes=TENSOR_LIMIT,
        max_upload_bytes=UPLOAD_LIMIT,
    )  # fmt: skip
    app = create_app(settings)
    async with serving(app):
        kiln = app.state.kiln
        manifest = ModelManifest(name="limited", task="tensor", engine="onnxruntime")
        async with kiln.db.sessions.begin() as session:
            made = await make_root_key(session, settings.hmac_key(), tenant="operators")
            await register_version(session, manifest, "1", f"sha256:{'e' * 64}")
        await kiln.resolver.refresh()
        yield Server(app, made.secret, "limited")


def assert_openai_413(answer: Answer) -> None:
    assert answer.status == 413
    error = answer.json()["error"]
    assert error["code"] == "request_too_large"
    assert error["param"] is None
    assert str(JSON_LIMIT) in error["message"]


@pytest.mark.parametrize("idempotency_key", [None, "big-body-1"])
async def test_a_512_mib_embeddings_body_is_refused_after_the_limit(
    server: Server, idempotency_key: str | None
) -> None:
    source = Source(HUGE)
    headers = {"idempotency-key": idempotency_key} if idempotency_key else {}
    answer = await server.post("/v1/embeddings", source, headers)
    assert_openai_413(answer)
    assert JSON_LIMIT < source.pulled <= JSON_LIMIT + CHUNK


async def test_a_lying_content_length_does_not_raise_the_limit(server: Server) -> None:
    source = Source(HUGE)
    answer = await server.post(
        "/v1/embeddings", source, {"content-length": "100", "idempotency-key": "liar"}
    )
    assert_openai_413(answer)
    assert source.pulled <= JSON_LIMIT + CHUNK


async def test_a_declared_oversized_body_is_refused_unread(server: Server) -> None:
    source = Source(HUGE)
    answer = await server.post("/v1/embeddings", source, {"content-length": str(HUGE)})
    assert_openai_413(answer)
    assert source.pulled == 0


async def test_a_body_within_the_limit_reaches_the_route(server: Server) -> None:
    body = json.dumps({"model": "limited", "input": "x" * (JSON_LIMIT - 100)}).encode()
    source = Source(len(body), _piece=body)
    answer = await server.post("/v1/embeddings", source)
    assert source.pulled == len(body)
    assert answer.status == 400  # read and decoded: `limited` is no embeddings model
    assert "embed" in answer.json()["error"]["message"]


@pytest.mark.parametrize("path", ["/rerank", "/classify", "/tokenize", "/v2/rerank"])
async def test_vllms_other_routes_take_v1s_limit(server: Server, path: str) -> None:
    """A rerank of many documents at vLLM's own paths is read as at ``/v1/rerank``, its errors
    OpenAI's (Cohere's v2 rerank too, under `/v2`)."""
    documents = ["x" * 1000] * (2 * SMALL_BODY_BYTES // 1000)
    body = json.dumps({"model": "limited", "query": "q", "documents": documents}).encode()
    assert SMALL_BODY_BYTES < len(body) < JSON_LIMIT
    answer = await server.post(path, Source(len(body), _piece=body))
    assert answer.status == 400  # read whole and decoded, not a 413
    huge = Source(HUGE)
    assert_openai_413(await server.post(path, huge))
    assert JSON_LIMIT < huge.pulled <= JSON_LIMIT + CHUNK


async def test_v2_tensor_bodies_have_their_own_limit(server: Server) -> None:
    source = Source(HUGE)
    answer = await server.post(
        f"/v2/models/{server.model}/infer", source, {"content-type": "application/octet-stream"}
    )
    assert answer.status == 413
    assert str(TENSOR_LIMIT) in answer.json()["error"]
    assert TENSOR_LIMIT < source.pulled <= TENSOR_LIMIT + CHUNK


async def test_admin_json_is_small(server: Server) -> None:
    source = Source(HUGE)
    answer = await server.post("/admin/v1/tenants", source, {"idempotency-key": "admin-big"})
    assert answer.status == 413
    assert answer.headers["content-type"].startswith("application/problem+json")
    assert answer.json()["status"] == 413
    assert SMALL_BODY_BYTES < source.pulled <= SMALL_BODY_BYTES + CHUNK


async def test_model_uploads_take_the_upload_limit(server: Server) -> None:
    source = Source(HUGE)
    answer = await server.post(
        f"/admin/v1/models/up-{uuid.uuid4().hex[:6]}/versions", source,
        {"content-type": "application/octet-stream"},
    )  # fmt: skip
    assert answer.status == 413
    assert UPLOAD_LIMIT < source.pulled <= UPLOAD_LIMIT + CHUNK
