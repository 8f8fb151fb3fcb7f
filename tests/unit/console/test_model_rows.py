"""The models page's version states: serving, not routed, building, failed."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from kiln_console.model_rows import rows
from kiln_platform.compiler.schemas import CompileJobView
from kiln_platform.registry.schemas import RouteView

pytestmark = pytest.mark.unit


def _job(version: str, status: str) -> CompileJobView:
    return CompileJobView(
        id=version, model="m", version=version, target="cpu", precision="fp32", hardware="cpu",
        status=status, reason=None, engine_digest=None, report=None,
        created_at=datetime.now(UTC), started_at=None, finished_at=None,
    )  # fmt: skip


def test_states_follow_the_route_and_the_import_jobs() -> None:
    route = RouteView(model="m", stable_version="1", canary_version="3", canary_percent=10)
    jobs = [_job("5", "running"), _job("4", "failed"), _job("3", "done"), _job("4", "done")]
    found = {r.version: (r.state, r.serves) for r in rows(route, ["1", "2", "3"], jobs, {}, {})}
    assert found == {
        "1": ("serving", "stable (90 %)"),
        "2": ("not routed", ""),
        "3": ("serving", "canary (10 %)"),
        "4": ("failed", ""),  # the newest job of version 4 failed
        "5": ("building", ""),
    }
