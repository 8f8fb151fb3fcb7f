"""Traces across processes: a real ``kiln up`` (gateway + worker processes) exports OTLP over
HTTP to a receiver on loopback that decodes ``ExportTraceServiceRequest`` protobufs; requests
through the official openai SDK carry the client's ``traceparent``. Each request is one trace
under the client's span, and the worker's spans sit under the gateway's ``dispatch`` span."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import openai
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from tests.e2e.conftest import MINILM, SMOLLM2, KilnProcess, free_port


@dataclass(frozen=True)
class Received:
    """One span as the receiver decoded it."""

    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, Any]


class Receiver(ThreadingHTTPServer):
    """An OTLP/HTTP trace receiver (``POST /v1/traces``, protobuf) that keeps every span."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.spans: list[Received] = []
        self.lock = threading.Lock()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def trace(self, trace_id: str) -> list[Received]:
        with self.lock:
            return [s for s in self.spans if s.trace_id == trace_id]


class _Handler(BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["content-length"]))
        ok = self.path == "/v1/traces" and self.headers["content-type"] == "application/x-protobuf"
        if ok:
            request = ExportTraceServiceRequest.FromString(body)
            with self.server.lock:
                self.server.spans.extend(_spans(request))
        answer = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200 if ok else 400)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _spans(request: ExportTraceServiceRequest) -> Iterator[Received]:
    for resource_spans in request.resource_spans:
        resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                attributes = {a.key: _value(a.value) for a in span.attributes}
                ids = (span.trace_id.hex(), span.span_id.hex(), span.parent_span_id.hex())
                yield Received(resource["service.name"], span.name, *ids, attributes)


def _value(value: Any) -> Any:
    return getattr(value, value.WhichOneof("value")) if value.WhichOneof("value") else None


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def kiln(
    receiver: Receiver, both_models: Callable[..., AbstractContextManager[KilnProcess]]
) -> Iterator[KilnProcess]:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "50",
           "KILN_GRPC_PORT": str(free_port())}  # fmt: skip
    with both_models(env) as up:
        up.env["TEST_TENANT_ID"] = up.cli("tenants", "create", "acme").strip()
        up.env["TEST_KEY"] = up.new_key("acme")
        up.wait_until_serving(MINILM)
        up.wait_until_serving(SMOLLM2, path="completions")
        yield up


def _parent(n: int) -> tuple[str, str, dict[str, str]]:
    trace_id, span_id = f"{n:032x}", f"{n:016x}"
    return trace_id, span_id, {"traceparent": f"00-{trace_id}-{span_id}-01"}


def _settled(receiver: Receiver, trace_id: str, server: str, worker_span: str) -> list[Received]:
    """The trace once the worker's spans (exported from its own process) and the gateway's
    server span (ended after the response's last byte) have arrived."""
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        spans = receiver.trace(trace_id)
        if {server, worker_span, "batch compute", "ledger commit"} <= {s.name for s in spans}:
            return spans
        time.sleep(0.05)
    raise AssertionError(f"trace {trace_id} incomplete: {sorted(s.name for s in spans)}")


def _check(spans: list[Received], server_name: str, client_span: str, worker_span: str) -> None:
    by_name = {s.name: s for s in spans}
    server = by_name[server_name]
    assert (server.service, server.parent_id) == ("kiln", client_span)
    dispatch = by_name["dispatch"]
    worker = by_name[worker_span]
    assert (worker.service, worker.parent_id) == ("kiln-worker", dispatch.span_id)
    for stage in ("worker queue", "batch compute"):
        assert (by_name[stage].service, by_name[stage].parent_id) == ("kiln-worker", worker.span_id)
    assert by_name["batch compute"].attributes["kiln.batch_size"] >= 1
    for stage in ("auth", "admission", "tokenize", "ledger commit"):
        assert by_name[stage].parent_id == server.span_id, stage
    names = [s.name for s in spans]
    assert len(names) == len(set(names)), names  # one of each: one request, one trace


def test_worker_spans_under_dispatch_and_client_traceparent_honoured(
    kiln: KilnProcess, receiver: Receiver
) -> None:
    client = openai.OpenAI(base_url=f"{kiln.base_url}/v1", api_key=kiln.key, max_retries=0)
    trace_id, span_id, headers = _parent(1)
    raw = client.embeddings.with_raw_response.create(
        model=MINILM, input=["one", "two"], extra_headers=headers
    )
    assert raw.headers["traceparent"].startswith(f"00-{trace_id}-")
    spans = _settled(receiver, trace_id, "POST /v1/embeddings", "worker /embed")
    _check(spans, "POST /v1/embeddings", span_id, "worker /embed")
    by_name = {s.name: s for s in spans}
    assert (
        raw.headers["traceparent"] == f"00-{trace_id}-{by_name['POST /v1/embeddings'].span_id}-01"
    )
    assert by_name["fair queue"].parent_id == by_name["POST /v1/embeddings"].span_id

    messages: Any = [{"role": "user", "content": "Hi"}]
    for n, stream in ((2, False), (3, True)):
        trace_id, span_id, headers = _parent(n)
        answer = client.chat.completions.create(
            model=SMOLLM2, messages=messages, max_tokens=4, stream=stream, extra_headers=headers
        )
        if stream:
            assert list(answer)
        spans = _settled(receiver, trace_id, "POST /v1/chat/completions", "worker /generate")
        _check(spans, "POST /v1/chat/completions", span_id, "worker /generate")
        by_name = {s.name: s for s in spans}
        detokenize = by_name["detokenize"]
        assert detokenize.parent_id == by_name["POST /v1/chat/completions"].span_id
        assert by_name["dispatch"].parent_id == detokenize.span_id


def test_a_grpc_call_is_traced_as_an_http_one(kiln: KilnProcess, receiver: Receiver) -> None:
    """``ModelInfer`` (an LLM's text tensors, ``tritonclient.grpc``) with the client's
    ``traceparent`` metadata: its server span sits under the client's span, the worker's under
    its ``dispatch``; a refused call's span has its status code, and its ``traceparent`` comes
    back in the trailing metadata."""
    import grpc
    import numpy as np
    import tritonclient.grpc as triton_grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    trace_id, span_id, headers = _parent(4)
    client = triton_grpc.InferenceServerClient(f"127.0.0.1:{kiln.env['KILN_GRPC_PORT']}")
    prompt = triton_grpc.InferInput("text_input", [1], "BYTES")
    prompt.set_data_from_numpy(np.array(["Hi"], dtype=object))
    most = triton_grpc.InferInput("max_tokens", [1], "INT32")
    most.set_data_from_numpy(np.array([4], dtype=np.int32))
    name = "inference.GRPCInferenceService/ModelInfer"
    result = client.infer(SMOLLM2, [prompt, most],
                          headers={"authorization": f"Bearer {kiln.key}", **headers})  # fmt: skip
    assert result.as_numpy("text_output") is not None
    spans = _settled(receiver, trace_id, name, "worker /generate")
    _check(spans, name, span_id, "worker /generate")
    server = {s.name: s for s in spans}[name]
    assert server.attributes["rpc.method"] == "ModelInfer"
    assert server.attributes["rpc.grpc.status_code"] == 0
    client.close()

    trace_id, span_id, headers = _parent(5)
    channel = grpc.insecure_channel(f"127.0.0.1:{kiln.env['KILN_GRPC_PORT']}")
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    metadata = (("authorization", f"Bearer {kiln.key}"), *headers.items())
    with pytest.raises(grpc.RpcError) as refused:
        stub.ModelMetadata(service_pb2.ModelMetadataRequest(name="nope"), metadata=metadata)
    echoed = dict(refused.value.trailing_metadata())["traceparent"]
    name = "inference.GRPCInferenceService/ModelMetadata"
    deadline = time.monotonic() + 15
    while not (found := [s for s in receiver.trace(trace_id) if s.name == name]):
        assert time.monotonic() < deadline, "the server span did not arrive"
        time.sleep(0.05)
    (server,) = found
    assert server.parent_id == span_id
    assert echoed == f"00-{trace_id}-{server.span_id}-01"
    assert server.attributes["rpc.grpc.status_code"] == grpc.StatusCode.NOT_FOUND.value[0]
    channel.close()
