"""``KILN_WORKER_DECODING_PREFILL`` reaches the worker's ``--decoding-prefill`` and its engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from kiln_platform.pools.backend import PoolSpec, worker_arguments
from kiln_platform.settings import Settings
from kiln_runtimes.worker import parse_args


@pytest.mark.parametrize(("env", "tokens"), [(None, 24), ("64", 64), ("2", 2)])
def test_the_setting_reaches_the_engine_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: str | None, tokens: int
) -> None:
    if env is not None:
        monkeypatch.setenv("KILN_WORKER_DECODING_PREFILL", env)
    args = worker_arguments(PoolSpec("m", "1", tmp_path), Settings(data_dir=tmp_path), 9000)
    assert parse_args(args).engine_options().decoding_prefill == tokens


@pytest.mark.parametrize("tokens", [1, 129])
def test_a_budget_outside_two_to_a_chunk_is_refused(tmp_path: Path, tokens: int) -> None:
    with pytest.raises(ValueError, match="worker_decoding_prefill"):
        Settings(data_dir=tmp_path, worker_decoding_prefill=tokens)


@pytest.mark.parametrize("tokens", ["1", "129"])
def test_the_worker_refuses_a_budget_outside_two_to_a_chunk(tokens: str) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--model-dir", "m", "--decoding-prefill", tokens])
