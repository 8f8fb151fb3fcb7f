"""``KILN_WORKER_PREFIX_CACHE_MB`` reaches the worker's ``--prefix-cache-mb`` (0: no cache)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kiln_platform.pools.backend import PoolSpec, worker_arguments
from kiln_platform.settings import Settings
from kiln_runtimes.worker import parse_args


@pytest.mark.parametrize(("env", "mb"), [(None, 256), ("0", 0), ("64", 64)])
def test_the_setting_reaches_the_workers_command_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: str | None, mb: int
) -> None:
    if env is not None:
        monkeypatch.setenv("KILN_WORKER_PREFIX_CACHE_MB", env)
    args = worker_arguments(PoolSpec("m", "1", tmp_path), Settings(data_dir=tmp_path), 9000)
    assert parse_args(args).prefix_cache_mb == mb


def test_a_negative_size_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="prefix_cache_mb"):
        Settings(data_dir=tmp_path, worker_prefix_cache_mb=-1)
