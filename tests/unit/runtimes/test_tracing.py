"""``kiln_runtimes.tracing``: off unless ``OTEL_*`` names an exporter, and then the trace id in
the log context of the gateway's server span and the worker's continued span."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import structlog
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from kiln_platform.observability import tracing_middleware
from kiln_platform.subprocess_env import child_environment
from kiln_runtimes import tracing

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    memory = InMemorySpanExporter()
    tracing.configure({}, "test", exporter=memory)
    try:
        yield memory
    finally:
        tracing.shutdown()


@pytest.mark.parametrize(
    ("environ", "names"),
    [
        ({}, []),
        ({"OTEL_SERVICE_NAME": "kiln", "OTEL_TRACES_SAMPLER": "always_on"}, []),
        ({"OTEL_TRACES_EXPORTER": "none"}, []),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, ["otlp"]),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, ["otlp"]),
        ({"OTEL_TRACES_EXPORTER": "otlp,console"}, ["otlp", "console"]),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}, []),
    ],
)
def test_only_a_named_exporter_turns_tracing_on(environ: dict[str, str], names: list[str]) -> None:
    assert tracing.exporter_names(environ) == names


def test_off_no_provider_and_no_span_work() -> None:
    assert not tracing.configure({"OTEL_SERVICE_NAME": "kiln"}, "kiln")
    assert not tracing.enabled()
    first, second = tracing.span("auth"), tracing.span("tokenize", {"kiln.inputs": 2})
    assert first is second  # one shared null context: nothing made per stage
    with first as span:
        assert span is None
        assert tracing.traceparent() is None
    assert tracing.continued("worker /embed", PARENT) is first
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)  # no SDK installed


def test_off_the_gateway_and_worker_never_import_opentelemetry() -> None:
    """Off costs nothing at start-up either: the processes hold none of the API or the SDK."""
    code = (
        "import sys\n"
        "from kiln_platform import app\n"
        "from kiln_runtimes import tracing, worker\n"
        "assert not tracing.configure({'OTEL_SERVICE_NAME': 'kiln'}, 'kiln')\n"
        "with tracing.span('auth'), tracing.continued('embed', '" + PARENT + "'):\n"
        "    assert tracing.traceparent() is None and tracing.extract('" + PARENT + "') is None\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_worker_continues_the_trace_with_its_id_in_the_logs(
    exporter: InMemorySpanExporter,
) -> None:
    async def handler() -> None:  # a worker request: a task of its own
        with tracing.continued("worker /embed", PARENT):
            tracing.record("worker queue", 1, 2)
        assert structlog.contextvars.get_contextvars()["trace_id"] == PARENT.split("-")[1]

    asyncio.run(handler())
    assert "trace_id" not in structlog.contextvars.get_contextvars()
    queue, server = exporter.get_finished_spans()
    assert server.parent is not None
    assert server.parent.span_id == int(PARENT.split("-")[2], 16)
    assert queue.parent is not None
    assert queue.parent.span_id == server.context.span_id


def test_gateway_server_span_logs_its_trace_and_echoes_traceparent(
    exporter: InMemorySpanExporter,
) -> None:
    seen: dict[str, Any] = {}
    sent: list[dict[str, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.update(structlog.contextvars.get_contextvars())
        await send({"type": "http.response.start", "status": 200, "headers": []})

    async def send(message: Any) -> None:
        sent.append(message)

    headers = [(b"traceparent", PARENT.encode())]
    state = {"request_id": "req_1"}
    scope = {"type": "http", "method": "POST", "path": "/v1/embeddings", "headers": headers,
             "state": state}  # fmt: skip
    asyncio.run(tracing_middleware(app)(scope, None, send))  # type: ignore[arg-type]
    assert seen["trace_id"] == PARENT.split("-")[1]
    (span,) = exporter.get_finished_spans()
    echoed = dict(sent[0]["headers"])[b"traceparent"].decode()
    assert echoed == f"00-{PARENT.split('-')[1]}-{span.context.span_id:016x}-01"


def test_workers_inherit_the_otel_environment() -> None:
    parent = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "KILN_SECRET_KEY": "no"}
    assert child_environment(parent) == {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}


def test_an_unsampled_request_keeps_its_ids_but_records_nothing(
    exporter: InMemorySpanExporter,
) -> None:
    seen: dict[str, Any] = {}
    sent: list[dict[str, Any]] = []
    unsampled = PARENT[:-2] + "00"

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.update(structlog.contextvars.get_contextvars())
        seen["stage"] = tracing.span("auth")
        await send({"type": "http.response.start", "status": 200, "headers": []})

    async def send(message: Any) -> None:
        sent.append(message)

    headers = [(b"traceparent", unsampled.encode())]
    scope = {"type": "http", "method": "POST", "path": "/v1/embeddings", "headers": headers,
             "state": {}}  # fmt: skip
    asyncio.run(tracing_middleware(app)(scope, None, send))  # type: ignore[arg-type]
    assert seen["trace_id"] == PARENT.split("-")[1]
    assert seen["stage"] is tracing.span("tokenize")  # the shared null context
    assert dict(sent[0]["headers"])[b"traceparent"].decode().endswith("-00")
    assert exporter.get_finished_spans() == ()


def _request(headers: list[tuple[bytes, bytes]]) -> tuple[dict[str, Any], str]:
    """One API request through the server-span middleware: what its handler saw (log context,
    the current span, the ``traceparent`` a dispatch would send), and the echoed header."""
    seen: dict[str, Any] = {}
    sent: list[dict[str, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.update(structlog.contextvars.get_contextvars())
        seen["span"], seen["dispatched"] = trace.get_current_span(), tracing.traceparent()
        await send({"type": "http.response.start", "status": 200, "headers": []})

    async def send(message: Any) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/embeddings", "headers": headers,
             "state": {}}  # fmt: skip
    asyncio.run(tracing_middleware(app)(scope, None, send))  # type: ignore[arg-type]
    return seen, dict(sent[0]["headers"])[b"traceparent"].decode()


def test_a_request_the_sampler_leaves_out_makes_no_span(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0")
    memory = InMemorySpanExporter()
    tracing.configure({}, "test", exporter=memory)
    try:
        seen, echoed = _request([])
        assert seen["span"] is trace.INVALID_SPAN  # no span object, no context attached
        assert echoed == seen["dispatched"]  # the worker gets what the client gets
        version, trace_id, span_id, flags = echoed.split("-")
        assert (version, flags, seen["trace_id"]) == ("00", "02", trace_id)  # random, unsampled
        assert int(trace_id, 16)
        assert int(span_id, 16)
        assert tracing.traceparent() is None  # the request's own ended with it

        # the worker follows the unsampled flag: no span, the trace id still in its logs
        async def handler() -> None:
            with tracing.continued("worker /embed", echoed) as span:
                assert span is None
            assert structlog.contextvars.get_contextvars()["trace_id"] == trace_id

        asyncio.run(handler())
        assert memory.get_finished_spans() == ()
    finally:
        tracing.shutdown()


def test_a_sampled_root_span_keeps_the_id_the_sampler_was_asked_about(
    exporter: InMemorySpanExporter,
) -> None:
    seen, echoed = _request([])
    (span,) = exporter.get_finished_spans()
    assert span.context is not None
    assert seen["trace_id"] == f"{span.context.trace_id:032x}"
    assert echoed == f"00-{seen['trace_id']}-{span.context.span_id:016x}-03"  # sampled, random
    assert seen["dispatched"] == echoed


@pytest.mark.parametrize("header", ["junk", "00-" + "0" * 32 + "-00f067aa0ba902b7-01"])
def test_an_invalid_traceparent_starts_a_new_trace(
    exporter: InMemorySpanExporter, header: str
) -> None:
    seen, echoed = _request([(b"traceparent", header.encode())])
    (span,) = exporter.get_finished_spans()
    assert span.parent is None
    assert span.context is not None
    assert echoed.split("-")[1] == seen["trace_id"] == f"{span.context.trace_id:032x}" != "0" * 32
