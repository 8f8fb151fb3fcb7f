"""The server span of a gRPC call (or of one request on a ``ModelStreamInfer`` stream), as an
HTTP request has its own (``observability.tracing_middleware``)."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import structlog

from kiln_platform.gateway.oip_grpc_codec import SERVICE
from kiln_platform.observability import TRACEPARENT_HEADER
from kiln_runtimes import tracing

if TYPE_CHECKING:
    from collections.abc import Iterator


@contextlib.contextmanager
def traced(
    method: str, headers: dict[str, str], request_id: str, trailing: list[tuple[str, str]]
) -> Iterator[Any]:
    """The call's server span (``None`` when tracing is off or the sampler leaves it out), its
    parent the client's ``traceparent`` metadata: its own is added to ``trailing`` (the call's
    trailing metadata), its trace id to every log line of the call."""
    attributes = {"rpc.system": "grpc", "rpc.service": SERVICE, "rpc.method": method,
                  "kiln.request_id": request_id}  # fmt: skip
    name = f"{SERVICE}/{method}"
    with tracing.server(name, headers.get(TRACEPARENT_HEADER), attributes) as served:
        if served is None:
            yield None
            return
        structlog.contextvars.bind_contextvars(trace_id=served.trace_id)
        trailing.append((TRACEPARENT_HEADER, served.traceparent))
        try:
            yield served.span
        finally:
            structlog.contextvars.unbind_contextvars("trace_id")
