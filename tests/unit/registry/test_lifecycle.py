"""Addressing, the version echo and deprecation notices: pure functions over a version."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from kiln_platform.errors import BadRequest, Gone
from kiln_platform.registry import lifecycle
from kiln_platform.registry.services import ResolvedVersion
from kiln_runtimes.protocol import ModelManifest

pytestmark = pytest.mark.unit

V3 = ResolvedVersion(
    "m", "3", "sha256:" + "ab12" * 16, ModelManifest(name="m", task="embeddings",
    engine="onnxruntime", dimensions=4), datetime(2026, 1, 1, tzinfo=UTC),
)  # fmt: skip


def test_addresses_split_on_the_first_at() -> None:
    assert lifecycle.address("m") == ("m", None)
    assert lifecycle.address("m@3") == ("m", "3")
    assert lifecycle.address("m@eu-2026-q1") == ("m", "eu-2026-q1")
    with pytest.raises(BadRequest):
        lifecycle.address("m@")


def test_an_active_version_is_echoed_without_notices() -> None:
    assert lifecycle.headers(V3) == {"x-kiln-model-version": "3"}
    assert lifecycle.fingerprint(V3) == "kiln-3-ab12ab12ab12"


def test_a_deprecated_version_carries_deprecation_and_sunset() -> None:
    since, sunset = datetime(2026, 6, 1, tzinfo=UTC), datetime(2027, 1, 1, tzinfo=UTC)
    found = lifecycle.headers(replace(V3, state="deprecated", deprecated_at=since, sunset=sunset,
                                      successor="4"))  # fmt: skip
    assert found["deprecation"] == f"@{int(since.timestamp())}"  # RFC 9745: a structured date
    assert found["sunset"] == "Fri, 01 Jan 2027 00:00:00 GMT"  # RFC 8594: an HTTP date
    assert found["link"] == '</v1/models/m@4>; rel="successor-version"'


def test_a_retired_version_is_gone_naming_its_successor() -> None:
    assert lifecycle.refuse_retired(V3) is V3
    with pytest.raises(Gone, match="m@4"):
        lifecycle.refuse_retired(replace(V3, state="retired", successor="4"))
    with pytest.raises(BadRequest) as refused:
        lifecycle.check_target("retired", "3", "stable_version")
    assert refused.value.param == "stable_version"
