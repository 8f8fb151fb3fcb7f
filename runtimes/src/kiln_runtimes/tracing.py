"""OpenTelemetry tracing for the gateway and the workers, off unless ``OTEL_*`` asks for it.

Configured once (the gateway's ``create_app``, the worker's ``main``) from the standard
environment: ``OTEL_TRACES_EXPORTER`` (``otlp``, ``console``, ``none``), else an
``OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT`` alone means ``otlp`` (OTLP over HTTP/protobuf);
``OTEL_TRACES_SAMPLER``/``_ARG``, ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES`` and
``OTEL_BSP_*`` are read by the SDK itself; ``OTEL_SDK_DISABLED=true`` wins over all. With no
exporter named, no SDK provider is made and :func:`span` is one ``is None`` check returning a
shared null context: the request path does no span or context work.

On, a request the sampler leaves out still makes no span object: the gateway asks the sampler
itself (:func:`server`) and, left out, only formats a ``traceparent`` (unsampled flag) that the
logs, the response and the worker get as a string; the worker follows that flag
(:func:`continued`). Only a sampled request makes spans and attaches OpenTelemetry contexts.

Spans are made on Kiln's own provider, never the process-global one, so a test can install an
in-memory exporter (:func:`configure` with ``exporter``) and take it away again. The trace
context crosses to a worker as a W3C ``traceparent`` string in the request message
(``kiln_runtimes.protocol``), the one wire contract.
"""

from __future__ import annotations

import contextlib
import contextvars
import re
import time
from typing import TYPE_CHECKING, NamedTuple

import structlog

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

    from opentelemetry import trace
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    from opentelemetry.util.types import Attributes

    from kiln_runtimes._sampling import SettableIds

_NULL: contextlib.nullcontext[None] = contextlib.nullcontext()
_propagator: TraceContextTextMapPropagator | None = None
_tracer: trace.Tracer | None = None
_provider: TracerProvider | None = None
_ids: SettableIds | None = None
_W3C = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
"""A version-00 ``traceparent`` (the fast path; anything else goes through the propagator)."""
_unsampled: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "kiln_unsampled_traceparent", default=None
)
"""The ``traceparent`` of the current request when the sampler left it out (no span exists)."""


class Served(NamedTuple):
    """A request's server span as :func:`server` made it: the span (``None``: not sampled, none
    made), the ``traceparent`` to echo and pass on, and the trace id for the logs."""

    span: trace.Span | None
    traceparent: str
    trace_id: str


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
    global _tracer, _provider, _ids, _propagator, trace  # noqa: PLW0603
    shutdown()
    names = [] if exporter is not None else exporter_names(environ)
    if exporter is None and not names:
        return False
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    from kiln_runtimes._sampling import SettableIds

    _propagator = TraceContextTextMapPropagator()
    name = environ.get("OTEL_SERVICE_NAME") or service
    _ids = SettableIds()
    provider = TracerProvider(resource=Resource.create({"service.name": name}), id_generator=_ids)
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
    global _tracer, _provider, _ids, _propagator  # noqa: PLW0603
    if _provider is not None:
        _provider.shutdown()
    _tracer = _provider = _ids = _propagator = None


def flush() -> None:
    """Export what is buffered (at a process's end: workers and gateways are stopped by signal)."""
    if _provider is not None:
        _provider.force_flush()


def enabled() -> bool:
    """Whether tracing is on in this process."""
    return _tracer is not None


def span(
    name: str, attributes: Attributes | None = None
) -> contextlib.AbstractContextManager[trace.Span | None]:
    """A span around a stage of the current request: a shared null context when tracing is
    off, or when the request's trace is not sampled (no span is current, or it records
    nothing)."""
    if _tracer is None or not _recording():
        return _NULL
    return _span(_tracer, name, None, False, attributes)


def _recording() -> bool:
    """Whether the current request is sampled (a left-out one is known without asking
    OpenTelemetry's context): a span is current and records."""
    return _unsampled.get() is None and trace.get_current_span().is_recording()


@contextlib.contextmanager
def _span(
    tracer: trace.Tracer, name: str, parent: Context | None, server: bool, attrs: Attributes | None
) -> Iterator[trace.Span]:
    kind = trace.SpanKind.SERVER if server else trace.SpanKind.INTERNAL
    with tracer.start_as_current_span(name, context=parent, kind=kind, attributes=attrs) as s:
        yield s


def server(
    name: str, incoming: str | None, attributes: Attributes | None = None
) -> contextlib.AbstractContextManager[Served | None]:
    """The server span of an API request, its parent the client's ``traceparent`` (if any), or
    a null context when tracing is off. The sampler is asked first: a request it leaves out
    gets no span (``Served.span`` is ``None``), only its ids, and :func:`traceparent` returns
    its ``traceparent`` (unsampled flag) until the request ends."""
    if _tracer is None or _provider is None or _ids is None:
        return _NULL
    return _server(name, incoming, attributes, tracer=_tracer, provider=_provider, ids=_ids)


@contextlib.contextmanager
def _server(
    name: str, incoming: str | None, attrs: Attributes | None,
    *, tracer: trace.Tracer, provider: TracerProvider, ids: SettableIds,
) -> Iterator[Served]:  # fmt: skip
    from kiln_runtimes._sampling import records

    parsed = _W3C.fullmatch(incoming) if incoming else None
    if incoming and parsed is None:  # another version, or malformed: the propagator's call
        with _span(tracer, name, extract(incoming), True, attrs) as s:
            yield Served(s, traceparent() or "", f"{s.get_span_context().trace_id:032x}")
        return
    trace_id, parent = _remote(parsed) if parsed else (0, None)
    trace_id = trace_id or ids.generate_trace_id()
    if records(provider, parent, trace_id, name, attrs):
        if parent is None:
            ids.next_trace_id = trace_id  # the root span keeps the id the sampler was asked about
        with _span(tracer, name, parent, True, attrs) as s:
            ids.next_trace_id = 0  # taken, unless a current span gave the trace its id
            yield Served(s, traceparent() or "", f"{s.get_span_context().trace_id:032x}")
        return
    random = int(parsed[3], 16) & 2 if parent is not None and parsed else 2  # as the SDK's flags
    unsampled = f"00-{trace_id:032x}-{ids.generate_span_id():016x}-{random:02x}"
    token = _unsampled.set(unsampled)
    try:
        yield Served(None, unsampled, f"{trace_id:032x}")
    finally:
        _unsampled.reset(token)


def _remote(parsed: re.Match[str]) -> tuple[int, Context | None]:
    """The trace id and the context of a parsed ``traceparent``'s remote span (``0, None``: its
    ids are invalid, a new trace starts)."""
    trace_id, span_id = int(parsed[1], 16), int(parsed[2], 16)
    if not trace_id or not span_id:
        return 0, None
    flags = trace.TraceFlags(int(parsed[3], 16))
    remote = trace.SpanContext(trace_id, span_id, is_remote=True, trace_flags=flags)
    return trace_id, trace.set_span_in_context(trace.NonRecordingSpan(remote))


def continued(
    name: str, traceparent: str | None, attributes: Attributes | None = None
) -> contextlib.AbstractContextManager[trace.Span | None]:
    """A server span continuing the trace a request message carries, its trace id bound to the
    log context of the request's task; a null context when tracing is off, the message carries
    none, or its unsampled flag says the gateway's sampler left it out (then only the trace id
    is bound: the worker follows the gateway's decision and makes no span)."""
    if _tracer is None or not traceparent:
        return _NULL
    parsed = _W3C.fullmatch(traceparent)
    if parsed is not None and not int(parsed[3], 16) & 1:
        structlog.contextvars.bind_contextvars(trace_id=parsed[1])
        return _NULL
    return _continued(_tracer, name, traceparent, attributes)


@contextlib.contextmanager
def _continued(
    tracer: trace.Tracer, name: str, traceparent: str, attrs: Attributes | None
) -> Iterator[trace.Span]:
    with _span(tracer, name, extract(traceparent), True, attrs) as s:
        # Left bound, like the request id: each request runs in a task of its own, whose context
        # ends with it, and the handler's last lines (after the span) are about it too.
        context = s.get_span_context()
        if context.is_valid:
            structlog.contextvars.bind_contextvars(trace_id=f"{context.trace_id:032x}")
        yield s


def record(name: str, start_ns: int, end_ns: int, attributes: Attributes | None = None) -> None:
    """A finished child span of the current one, for a stage timed elsewhere (a queue wait)."""
    if _tracer is not None and _recording():
        s = _tracer.start_span(name, start_time=start_ns, attributes=attributes)
        s.end(end_time=max(end_ns, start_ns))


def record_waited(name: str, seconds: float, attributes: Attributes | None = None) -> None:
    """A finished child span of the current one that ended now and lasted ``seconds``."""
    if _tracer is not None and _recording():
        now = time.time_ns()
        record(name, now - int(seconds * 1e9), now, attributes)


def traceparent() -> str | None:
    """The current request's W3C ``traceparent``: its current span's (the flags say whether the
    trace is sampled), or the one :func:`server` made for a request left out."""
    if _tracer is None:
        return None
    unsampled = _unsampled.get()
    if unsampled is not None:
        return unsampled
    carrier: dict[str, str] = {}
    if _propagator is not None:
        _propagator.inject(carrier)
    return carrier.get("traceparent")


def extract(value: str | None) -> Context | None:
    """The remote parent a ``traceparent`` names (``None``: start a new trace)."""
    if _tracer is None or _propagator is None or not value:
        return None
    return _propagator.extract({"traceparent": value})
