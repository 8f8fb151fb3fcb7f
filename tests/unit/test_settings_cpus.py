"""``KILN_WORKER_CPUS`` is checked when Kiln reads its settings; a bad value is a usage error."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from kiln_platform.settings import Settings
from kiln_runtimes import cpus


@pytest.mark.parametrize("value", ["1", "2-7", "0,2-3"])
def test_worker_cpus_accepts_what_the_worker_parses(value: str) -> None:
    assert cpus.parse(Settings(worker_cpus=value).worker_cpus or "")


@pytest.mark.parametrize("value", ["", "one", "1-", "1,,2", "-3", "3-1"])
def test_worker_cpus_rejects_a_malformed_list_naming_the_field(value: str) -> None:
    with pytest.raises(ValidationError, match="worker_cpus"):
        Settings(worker_cpus=value)


def test_kiln_names_a_bad_setting_without_a_traceback(tmp_path: Path) -> None:
    env = {**os.environ, "KILN_WORKER_CPUS": "abc", "KILN_DATA_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "kiln_console", "up"],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert "KILN_WORKER_CPUS" in done.stderr
    assert "'abc'" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "pg").exists(), "nothing started"
