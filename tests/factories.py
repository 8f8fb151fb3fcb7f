"""Factories for platform tests: tenants, keys and model versions, written once.

Each takes the session (or database) it works in and returns what the tests go on to use.
"""

from __future__ import annotations

from datetime import UTC, datetime

from kiln_platform.registry.services import ResolvedVersion
from kiln_runtimes.protocol import ModelManifest


def resolved_version(model: str, version: str = "1") -> ResolvedVersion:
    """A resolved version of ``model`` for code that only reads its name and version (pricing)."""
    manifest = ModelManifest(name=model, task="generate", engine="onnxruntime")
    return ResolvedVersion(
        model=model,
        version=version,
        artifact_digest="sha256:" + "0" * 64,
        manifest=manifest,
        created_at=datetime(2020, 1, 1, tzinfo=UTC),
    )
