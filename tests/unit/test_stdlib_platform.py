"""`platform/` must never shadow Python's stdlib ``platform`` module."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_stdlib_platform_wins_from_repo_root() -> None:
    code = "import platform, sys; print(platform.__file__); print(platform.python_version())"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert not out[0].startswith(str(REPO)), out[0]
    assert out[1] == ".".join(map(str, sys.version_info[:3]))


def test_platform_dir_is_not_a_package() -> None:
    assert not (REPO / "platform" / "__init__.py").exists()


def test_suite_runs_under_python_dash_m_pytest() -> None:
    """``python -m pytest`` puts the repo root on sys.path; the suite must still import (every
    test module collected, so every Kiln module imported) and run. One module runs: running the
    whole unit suite again would prove nothing more about imports."""
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/unit",
         "--co"],
        check=False, cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert " tests collected" in out.stdout
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "tests/unit/test_layering.py"],
        check=False, cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert " passed" in run.stdout
