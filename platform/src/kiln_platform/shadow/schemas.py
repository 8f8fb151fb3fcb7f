"""Shadow traffic on the wire: the admin API's config and comparison report."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

import msgspec

from kiln_platform.registry.schemas import Version


class ShadowUpdate(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``PUT /admin/v1/models/{name}/shadow``: the candidate and the share of requests copied."""

    version: Version
    percent: Annotated[int, msgspec.Meta(ge=0, le=100)]


class ShadowReport(msgspec.Struct, kw_only=True):
    """One gateway's comparison of a model's answers with a candidate's."""

    model: str
    candidate: str
    gateway: str
    mirrored: int = 0
    """Copies sent to the candidate."""
    dropped: dict[str, int] = {}
    """Copies not sent, by reason (``not_ready``, ``queued``, ``busy``, ``bound``,
    ``primary_queued``, ``primary_busy``: ``policy.Drop``)."""
    failed: int = 0
    """Copies the candidate answered with an error (or not in time)."""
    not_comparable: int = 0
    """Requests not copied because their answers cannot be compared (sampled generation)."""
    compared: int = 0
    agreement: float | None = None
    """Share of compared answers that agree (exact tokens, cosine >= 0.9999, diff <= 1e-5)."""
    cosine_mean: float | None = None
    cosine_min: float | None = None
    max_abs_diff: float | None = None
    primary_p50_ms: float | None = None
    """The primary's time: its worker call; for a generation, from its start to its commit,
    the client's reading of the stream included (not comparable with the copy's)."""
    primary_p99_ms: float | None = None
    shadow_p50_ms: float | None = None
    shadow_p99_ms: float | None = None
    shadow_error_rate: float | None = None
    """``failed / mirrored``; the primary answers compared are successful ones."""
    updated_at: datetime | None = None
    """When its gateway last wrote it (None: the live report of the gateway answering)."""


class ShadowView(msgspec.Struct, kw_only=True):
    """A model's shadow config (``version`` None: none set) and every gateway's report."""

    model: str
    version: str | None = None
    percent: int = 0
    reports: list[ShadowReport] = []
