"""The terraform root module is formatted, validates offline against the pinned AWS provider,
and checkov finds nothing it has not been told, with a reason, to skip."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

TERRAFORM = Path(__file__).resolve().parents[2] / "terraform"
PLUGINS = Path("/opt/tf-plugins")  # a filesystem mirror of hashicorp/aws 5.100.0 (no network)

needs_terraform = pytest.mark.skipif(
    shutil.which("terraform") is None, reason="terraform is not installed on this machine"
)


def _terraform(args: list[str], cwd: Path, tmp: Path) -> subprocess.CompletedProcess[str]:
    config = tmp / "terraformrc"
    config.touch()
    env = {
        **os.environ,
        "TF_CLI_CONFIG_FILE": str(config),  # nobody's provider_installation or credentials
        "TF_DATA_DIR": str(tmp / "data"),  # no .terraform/ in the repository
        "TF_IN_AUTOMATION": "1",
        "CHECKPOINT_DISABLE": "1",  # no version check over the network
    }
    return subprocess.run(
        ["terraform", *args],
        check=False, cwd=cwd, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@needs_terraform
def test_fmt(tmp_path: Path) -> None:
    out = _terraform(["fmt", "-check", "-recursive", "-diff"], TERRAFORM, tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr


@needs_terraform
@pytest.mark.slow
def test_init_and_validate(tmp_path: Path) -> None:
    if not PLUGINS.is_dir():
        pytest.skip(f"no terraform provider mirror at {PLUGINS} (validate needs hashicorp/aws)")
    copy = tmp_path / "terraform"  # init writes .terraform.lock.hcl beside the module
    shutil.copytree(TERRAFORM, copy, ignore=shutil.ignore_patterns(".terraform*", "kubernetes"))
    init = _terraform(
        ["init", "-backend=false", "-input=false", f"-plugin-dir={PLUGINS}", "-no-color"],
        copy,
        tmp_path,
    )
    assert init.returncode == 0, init.stdout + init.stderr
    out = _terraform(["validate", "-json", "-no-color"], copy, tmp_path)
    report = json.loads(out.stdout)
    assert report["valid"], json.dumps(report["diagnostics"], indent=2)
    assert report["warning_count"] == 0, json.dumps(report["diagnostics"], indent=2)
    assert not (TERRAFORM / ".terraform").exists()
    assert not (TERRAFORM / ".terraform.lock.hcl").exists()


def _checkov() -> str:
    beside = Path(sys.executable).with_name("checkov")  # the dev group installs it in the venv
    found = str(beside) if beside.exists() else shutil.which("checkov")
    assert found, "checkov is missing: it is in the dev group (make setup)"
    return found


@pytest.mark.slow
def test_checkov_finds_nothing_unexplained() -> None:
    out = subprocess.run(
        [_checkov(), "-d", str(TERRAFORM), "--framework", "terraform", "--compact",
         "--skip-download", "-o", "json"],  # --quiet would leave the skipped checks out
        check=False, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert out.stdout.lstrip().startswith("{"), out.stderr[-2000:]  # a crash prints no report
    report: dict[str, Any] = json.loads(out.stdout)
    summary = report["summary"]
    failed = [
        f"{c['check_id']} {c['resource']} ({c['file_path']}): {c['check_name']}"
        for c in report["results"]["failed_checks"]
    ]
    assert not failed, "\n".join(failed)
    assert out.returncode == 0, out.stderr[-2000:]
    assert summary["parsing_errors"] == 0
    assert summary["passed"] > 150, summary  # it really read the modules
    for check in report["results"]["skipped_checks"]:
        reason = check["check_result"].get("suppress_comment") or ""
        where = f"{check['check_id']} on {check['resource']}"
        assert len(reason) > 20, f"{where} is skipped without a reason"
