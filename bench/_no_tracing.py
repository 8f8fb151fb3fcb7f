"""``kiln_runtimes.tracing`` compiled out: the same names, each doing nothing, and no
OpenTelemetry import. ``bench/tracing.py --baseline stripped`` puts this file over the module in
a worktree of ``HEAD``, so the baseline is this very code without tracing (see
docs/benchmarks.md)."""

from __future__ import annotations

import contextlib
from typing import Any

_NULL: contextlib.nullcontext[None] = contextlib.nullcontext()


def exporter_names(environ: Any) -> list[str]:
    return []


def configure(environ: Any, service: str, exporter: Any = None) -> bool:
    return False


def shutdown() -> None:
    pass


def flush() -> None:
    pass


def enabled() -> bool:
    return False


def span(name: str, attributes: Any = None) -> Any:
    return _NULL


def server(name: str, incoming: str | None, attributes: Any = None) -> Any:
    return _NULL


def continued(name: str, traceparent: str | None, attributes: Any = None) -> Any:
    return _NULL


def record(name: str, start_ns: int, end_ns: int, attributes: Any = None) -> None:
    pass


def record_waited(name: str, seconds: float, attributes: Any = None) -> None:
    pass


def traceparent() -> str | None:
    return None


def extract(value: str | None) -> None:
    return None
