"""The environment of the processes the gateway starts (workers, compile jobs): an allowlist.

A child gets what running Python and the engines needs, never the gateway's own settings:
``KILN_SECRET_KEY``, ``KILN_DATABASE_URL``, ``KILN_OIDC_CLIENT_SECRET``, cloud credentials and
whatever else the gateway's environment holds stay out. Taken once, when the gateway starts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping

NAMES = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "VIRTUAL_ENV",
    "LD_LIBRARY_PATH", "SSL_CERT_FILE", "SSL_CERT_DIR",
})  # fmt: skip
PREFIXES = (
    "LC_", "PYTHON", "OMP_", "OPENBLAS_", "MKL_", "CUDA_", "NVIDIA_", "ORT_", "COVERAGE_", "OTEL_",
)  # fmt: skip
"""Locale; the interpreter (``PYTHONPATH`` and friends); thread pools and GPUs of the engines;
subprocess coverage for the tests; OpenTelemetry's ``OTEL_*`` (a worker traces as its gateway
does; an OTLP header may hold an exporter's token, meant for the worker's exports too)."""


def child_environment(parent: Mapping[str, str], **extra: str) -> dict[str, str]:
    """The allowed part of ``parent`` (the gateway's ``os.environ``), plus ``extra``."""
    kept = {k: v for k, v in parent.items() if k in NAMES or k.startswith(PREFIXES)}
    return kept | extra
