"""The Mirror's copies: run apart from the primary request (its Server-Timing and log context),
and reports kept for the next save when one fails."""

from __future__ import annotations

import asyncio
import contextlib
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pytest
import structlog

from kiln_platform import observability
from kiln_platform.shadow.mirror import Mirror, Plan
from kiln_platform.shadow.stats import ShadowStats
from kiln_runtimes.protocol import EmbedRequest, EmbedResult, ModelManifest

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

pytestmark = pytest.mark.unit


class _Pools:
    def load(self, pool: str) -> tuple[int, int, int]:
        return 2, 0, 0


class _Workers:
    def __init__(self, dimensions: int = 2) -> None:
        self.seen: dict[str, Any] = {}
        self.dimensions = dimensions

    async def embed(self, pool: str, request: EmbedRequest, terms: object) -> EmbedResult:
        self.seen = structlog.contextvars.get_contextvars()
        observability.timing("compute", 999.0)  # what dispatch reports for the copy
        data = np.ones((len(request.input_ids), self.dimensions), "<f4").tobytes()
        return EmbedResult(
            request_id=request.request_id,
            dimensions=self.dimensions,
            data=data,
            queue_ms=0.0,
            compute_ms=999.0,
        )


def _mirror(workers: object) -> Mirror:
    return Mirror(cast(Any, None), cast(Any, _Pools()), cast(Any, workers), timeout_s=1.0)


def _plan(*, scores: bool = False) -> Plan:
    candidate = SimpleNamespace(pool="candidate-pool", version="v2")
    return Plan(cast(Any, candidate), ShadowStats("m", "v2"), "primary-pool", scores=scores)


async def test_a_copy_runs_outside_the_primary_requests_context() -> None:
    workers = _Workers()
    mirror = _mirror(workers)
    timings = {"compute": 5.0}
    observability._timings.set(timings)  # the primary's Server-Timing, as the middleware sets
    structlog.contextvars.bind_contextvars(request_id="req_primary")
    try:
        mirror.embed(_plan(), [[1, 2]], np.ones((1, 2), "<f4"), took_s=0.01)
        await asyncio.gather(*mirror._tasks)
    finally:
        structlog.contextvars.unbind_contextvars("request_id")
    assert timings == {"compute": 5.0}
    assert str(workers.seen["request_id"]).startswith("shadow_")


async def test_a_cross_encoders_copy_is_compared_by_its_scores() -> None:
    mirror = _mirror(_Workers(dimensions=1))  # the candidate scores every pair 1.0
    plan = _plan(scores=True)
    mirror.embed(plan, [[1, 2], [3, 4]], np.array([[0.25], [1.0]], "<f4"), took_s=0.01)
    await asyncio.gather(*mirror._tasks)
    report = plan.stats.report("g")
    assert (report.compared, report.agreement) == (1, 0.0)
    assert report.max_abs_diff == 0.75
    assert report.cosine_min is None  # two positive scores' cosine is 1 whatever they are


def test_a_candidate_that_prompts_otherwise_is_not_copied() -> None:
    """An embeddings copy sends the primary's token ids, its prompt included: a candidate
    whose prompts differ would be compared on text it does not read that way."""

    def version(name: str, prompts: dict[str, str]) -> Any:
        default = "q" if prompts else None
        manifest = ModelManifest(name="m", task="embeddings", engine="onnxruntime", dimensions=2,
                                 prompts=prompts, default_prompt_name=default)  # fmt: skip
        return SimpleNamespace(model="m", version=name, pool=f"pool-{name}", manifest=manifest)

    primary = version("1", {"q": "query: "})
    served = {"m": {"2": version("2", {"q": "query: "})}}
    resolver = SimpleNamespace(shadows={"m": SimpleNamespace(version="2", percent=100)},
                               served=served)  # fmt: skip
    mirror = Mirror(cast(Any, resolver), cast(Any, _Pools()), cast(Any, _Workers()), 1.0)
    assert mirror.plan(primary, "req_1") is not None
    served["m"]["2"] = version("2", {})
    assert mirror.plan(primary, "req_2") is None
    assert mirror.stats["m", "2"].not_comparable == 1


class _FailingSessions:
    """A session maker whose transaction fails to commit."""

    @contextlib.asynccontextmanager
    async def begin(self) -> AsyncIterator[object]:
        yield SimpleNamespace()
        raise ConnectionError("the database went away")


async def test_a_failed_save_keeps_the_reports_for_the_next_round(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def persist(session: object, reports: object) -> None:
        return None

    monkeypatch.setattr("kiln_platform.shadow.mirror.persist", persist)
    mirror = _mirror(_Workers())
    stats = mirror.stats.setdefault(("m", "v2"), ShadowStats("m", "v2"))
    stats.sent()
    with pytest.raises(ConnectionError):
        await mirror.save(cast(Any, _FailingSessions()))
    assert stats.changed


def test_string_outputs_agree_only_when_every_string_is_equal() -> None:
    from kiln_platform.shadow.mirror import _arrays
    from kiln_platform.shadow.policy import compare_tensors
    from kiln_runtimes import tensor_bytes
    from kiln_runtimes.protocol import Tensor

    def out(*names: str) -> dict[str, np.ndarray]:
        data = tensor_bytes.pack(names)
        return _arrays([Tensor(name="name", datatype="BYTES", shape=[len(names)], data=data)])

    assert compare_tensors(out("spam", "ham"), out("spam", "ham")).agrees
    assert not compare_tensors(out("spam", "ham"), out("spam", "hat")).agrees
    assert not compare_tensors(out("spam", "ham"), out("spam", "hams")).agrees
