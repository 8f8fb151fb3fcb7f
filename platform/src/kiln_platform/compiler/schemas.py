"""Compile-job request and response shapes (msgspec)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec


class CompileRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``POST /admin/v1/models/{name}/versions/{version}/compile``."""

    target: str = "cpu"
    precision: str = "fp32"


class CompileJobView(msgspec.Struct, kw_only=True):
    """A compile or build job as the admin API and the CLI show it.

    A build job (``kind`` build, from an import) names the version it registers when it is
    done; ``phase`` and ``percent`` follow the build (received, validating, converting,
    quantizing, optimizing, checking accuracy, ready); a failed one names the file and field
    at fault; its ``report`` holds the built tree's digest and the accuracy report.
    """

    id: str
    kind: str = "compile"
    model: str
    version: str
    task: str | None = None
    target: str
    precision: str
    hardware: str
    status: str
    phase: str | None = None
    percent: int = 0
    reason: str | None
    error_file: str | None = None
    error_field: str | None = None
    engine_digest: str | None
    report: dict[str, Any] | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


class UploadView(msgspec.Struct, kw_only=True):
    """``POST /admin/v1/models/{name}/versions`` response."""

    model: str
    version: str
    artifact_digest: str
    inputs: list[dict[str, Any]]
    outputs: list[dict[str, Any]]
    batching: bool
