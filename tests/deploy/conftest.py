"""The manifests of the cloud deployment in ``terraform/kubernetes``, loaded once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

MANIFESTS = Path(__file__).resolve().parents[2] / "terraform" / "kubernetes"


@pytest.fixture(scope="session")
def documents() -> list[tuple[Path, dict[str, Any]]]:
    """Every non-empty YAML document under ``terraform/kubernetes``, with its file."""
    found = [
        (path, doc)
        for path in sorted(MANIFESTS.rglob("*.y*ml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc
    ]
    assert found, f"no manifests in {MANIFESTS}"
    return found


@pytest.fixture(scope="session")
def resources(documents: list[tuple[Path, dict[str, Any]]]) -> dict[tuple[str, str], Any]:
    """Every manifest keyed by (kind, name)."""
    found: dict[tuple[str, str], Any] = {}
    for _, doc in documents:
        key = (doc["kind"], doc["metadata"]["name"])
        assert key not in found, f"{key} is defined twice"
        found[key] = doc
    return found
