"""OpenTelemetry tracing for the gateway and the workers, off unless ``OTEL_*`` asks for it.

Configured once (the gateway's ``create_app``, the worker's ``main``) from the standard
environment: ``OTEL_TRACES_EXPORTER`` (``otlp``, ``console``, ``none``), else an
``OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT`` alone means ``otlp`` (OTLP over HTTP/protobuf);
``OTEL_TRACES_SAMPLER``/``_ARG``, ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES`` and
``OTEL_BSP_*`` are read by the SDK itself; ``OTEL_SDK_DISABLED=true`` wins over all. With no
exporter named, no SDK provider is made and :func:`span` is one ``is None`` check returning a
shared null context: the request path does no span or context work.

Spans are made on Kiln's own provider, never the process-global one, so a test can install an
in-memory exporter (:func:`configure` with ``exporter``) and take it away again. The trace
context crosses to a worker as a W3C ``traceparent`` string in the request message
(``kiln_runtimes.protocol``), the one wire contract.
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING

import structlog
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.util.types import Attributes

_NULL: contextlib.nullcontext[None] = contextlib.nullcontext()
_propagator = TraceContextTextMapPropagator()
_tracer: trace.Tracer | None = None
_provider: TracerProvider | None = None


def exporter_names(environ: Mapping[str, str]) -> list[str]:
    """The exporters ``environ`` names (empty: tracing off)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    raw = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if not raw:
        endpoints = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        return ["otlp"] if any(environ.get(name) for name in endpoints) else []
    return [name.strip() for name in raw.split(",") if name.strip() not in ("", "none")]


def configure(
    environ: Mapping[str, str], service: str, exporter: SpanExporter | None = None
) -> bool:
    """Install Kiln's tracer if ``environ`` names an exporter (or ``exporter`` is given, which is
    then the only one, exporting synchronously); whether tracing is on."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    global _tracer, _provider
    shutdown()
    names = [] if exporter is not None else exporter_names(environ)
    if exporter is None and not names:
        return False
    name = environ.get("OTEL_SERVICE_NAME") or service
    provider = TracerProvider(resource=Resource.create({"service.name": name}))
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    for kind in names:
        provider.add_span_processor(BatchSpanProcessor(_exporter(kind)))
    _provider, _tracer = provider, provider.get_tracer("kiln")
    return True


def _exporter(kind: str) -> SpanExporter:
    if kind == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if kind != "otlp":
        raise ValueError(f"OTEL_TRACES_EXPORTER: unsupported exporter {kind!r} (otlp, console)")
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


def shutdown() -> None:
    """Export what is buffered and turn tracing off."""
    global _tracer, _provider  # noqa: PLW0603
    if _provider is not None:
        _provider.shutdown()
    _tracer = _provider = None


def flush() -> None:
    """Export what is buffered (at a process's end: workers and gateways are stopped by signal)."""
    if _provider is not None:
        _provider.force_flush()


def enabled() -> bool:
    """Whether tracing is on in this process."""
    return _tracer is not None


def span(
    name: str,
    attributes: Attributes | None = None,
    *,
    parent: Context | None = None,
    server: bool = False,
) -> contextlib.AbstractContextManager[trace.Span | None]:
    """A span around a stage of the current request: a shared null context when tracing is
    off, or when the request's trace is not sampled (a stage span would record nothing), unless
    it is a server span with its own ``parent``."""
    if _tracer is None:
        return _NULL
    if not server and parent is None and not trace.get_current_span().is_recording():
        return _NULL
    return _span(_tracer, name, parent, server, attributes)


@contextlib.contextmanager
def _span(
    tracer: trace.Tracer, name: str, parent: Context | None, server: bool, attrs: Attributes | None
) -> Iterator[trace.Span]:
    kind = trace.SpanKind.SERVER if server else trace.SpanKind.INTERNAL
    with tracer.start_as_current_span(name, context=parent, kind=kind, attributes=attrs) as s:
        yield s


def continued(
    name: str, traceparent: str | None, attributes: Attributes | None = None
) -> contextlib.AbstractContextManager[trace.Span | None]:
    """A server span continuing the trace a request message carries, its trace id bound to the
    log context of the request's task (a null context when tracing is off or the message
    carries none)."""
    if _tracer is None or not traceparent:
        return _NULL
    return _continued(_tracer, name, traceparent, attributes)


@contextlib.contextmanager
def _continued(
    tracer: trace.Tracer, name: str, traceparent: str, attrs: Attributes | None
) -> Iterator[trace.Span]:
    with _span(tracer, name, extract(traceparent), True, attrs) as s:
        # Left bound, like the request id: each request runs in a task of its own, whose context
        # ends with it, and the handler's last lines (after the span) are about it too.
        structlog.contextvars.bind_contextvars(trace_id=trace_id())
        yield s


def record(name: str, start_ns: int, end_ns: int, attributes: Attributes | None = None) -> None:
    """A finished child span of the current one, for a stage timed elsewhere (a queue wait)."""
    if _tracer is not None and trace.get_current_span().is_recording():
        s = _tracer.start_span(name, start_time=start_ns, attributes=attributes)
        s.end(end_time=max(end_ns, start_ns))


def record_waited(name: str, seconds: float, attributes: Attributes | None = None) -> None:
    """A finished child span of the current one that ended now and lasted ``seconds``."""
    if _tracer is not None and trace.get_current_span().is_recording():
        now = time.time_ns()
        record(name, now - int(seconds * 1e9), now, attributes)


def traceparent() -> str | None:
    """The current span's W3C ``traceparent`` (its flags say whether the trace is sampled)."""
    if _tracer is None:
        return None
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    return carrier.get("traceparent")


def extract(value: str | None) -> Context | None:
    """The remote parent a ``traceparent`` names (``None``: start a new trace)."""
    if _tracer is None or not value:
        return None
    return _propagator.extract({"traceparent": value})


def trace_id() -> str | None:
    """The current trace's id as 32 hex digits, if a span is recording."""
    if _tracer is None:
        return None
    context = trace.get_current_span().get_span_context()
    return f"{context.trace_id:032x}" if context.is_valid else None
