"""Engine settings in the gateway's environment reach the worker's command line and its
engine: ``KILN_WORKER_PREFIX_CACHE_MB`` (``--prefix-cache-mb``, 0: no cache) and
``KILN_WORKER_DECODING_PREFILL`` (``--decoding-prefill``); out-of-range values are refused on
both sides."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from kiln_platform.pools.backend import PoolSpec, worker_arguments
from kiln_platform.settings import Settings
from kiln_runtimes._settings import WorkerSettings
from kiln_runtimes.backends.base import DECODING_PREFILL, PREFILL_CHUNK
from kiln_runtimes.worker import parse_args


def _cache_mb(worker: WorkerSettings) -> int:
    return worker.prefix_cache_mb


def _budget(worker: WorkerSettings) -> int:
    return worker.engine_options().decoding_prefill


CACHE, BUDGET = "KILN_WORKER_PREFIX_CACHE_MB", "KILN_WORKER_DECODING_PREFILL"


@pytest.mark.parametrize(
    ("env", "read", "expected"),
    [
        ({}, _cache_mb, 256),
        ({CACHE: "0"}, _cache_mb, 0),
        ({CACHE: "64"}, _cache_mb, 64),
        ({}, _budget, DECODING_PREFILL),
        ({BUDGET: "64"}, _budget, 64),
        ({BUDGET: "2"}, _budget, 2),
    ],
)
def test_the_setting_reaches_the_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str],
    read: Callable[[WorkerSettings], int], expected: int,
) -> None:  # fmt: skip
    for variable, value in env.items():
        monkeypatch.setenv(variable, value)
    args = worker_arguments(PoolSpec("m", "1", tmp_path), Settings(data_dir=tmp_path), 9000)
    assert read(parse_args(args)) == expected


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("worker_prefix_cache_mb", -1),
        ("worker_decoding_prefill", 1),
        ("worker_decoding_prefill", PREFILL_CHUNK + 1),
    ],
)
def test_the_gateway_refuses_a_value_out_of_range(tmp_path: Path, field: str, value: int) -> None:
    with pytest.raises(ValueError, match=field):
        Settings(data_dir=tmp_path, **{field: value})  # type: ignore[arg-type]


@pytest.mark.parametrize("tokens", ["1", str(PREFILL_CHUNK + 1)])
def test_the_worker_refuses_a_budget_outside_two_to_a_chunk(tokens: str) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--model-dir", "m", "--decoding-prefill", tokens])
