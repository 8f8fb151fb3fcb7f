"""A pool at idle CPU priority (a shadow candidate's, a background twin's): the worker's flag,
its command line, the twin's name."""

from __future__ import annotations

from pathlib import Path

from kiln_platform.pools.backend import PoolSpec, worker_arguments
from kiln_platform.settings import Settings
from kiln_runtimes.worker import parse_args


def test_the_idle_flag_reaches_the_workers_settings_and_command_line(tmp_path: Path) -> None:
    assert parse_args(["--model-dir", "m", "--idle"]).idle
    assert not parse_args(["--model-dir", "m"]).idle
    settings = Settings(data_dir=tmp_path)
    spec = PoolSpec("m", "1", tmp_path)
    assert "--idle" not in worker_arguments(spec, settings, 9000)
    assert "--idle" in worker_arguments(spec.twin(), settings, 9000)
    assert spec.twin().key == "m@1+batch"


def test_a_twin_waits_its_full_batch_window_while_served_pools_adapt(tmp_path: Path) -> None:
    """A twin's lines are paced by the fixed wait (haste only takes CPU from served work)."""
    settings = Settings(data_dir=tmp_path)
    spec = PoolSpec("m", "1", tmp_path)
    assert "--fixed-wait" not in worker_arguments(spec, settings, 9000)
    assert "--fixed-wait" in worker_arguments(spec.twin(), settings, 9000)
