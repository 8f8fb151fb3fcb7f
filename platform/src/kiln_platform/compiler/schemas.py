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
    """A compile job as the admin API and the CLI show it."""

    id: str
    model: str
    version: str
    target: str
    precision: str
    hardware: str
    status: str
    reason: str | None
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
