"""`kiln models rollout` against a real PostgreSQL: the plan options are read only to start."""

from __future__ import annotations

from typing import TYPE_CHECKING

from click.testing import CliRunner

from kiln_platform.cli import kiln

if TYPE_CHECKING:
    from pathlib import Path


def test_bad_steps_only_break_a_start(database_uri: str, tmp_path: Path) -> None:
    runner = CliRunner(env={"KILN_DATABASE_URL": database_uri, "KILN_LOG_LEVEL": "warning"})

    def run(*args: str) -> tuple[int, str]:
        result = runner.invoke(kiln(), ["--data-dir", str(tmp_path), "models", "rollout", *args])
        return result.exit_code, result.output

    for shown_or_aborted in ([], ["--abort"]):  # no such model: Kiln's error, exit status 1
        code, output = run("no-such-model", "--steps", "5,x", *shown_or_aborted)
        assert (code, "does not exist" in output) == (1, True), output
    code, output = run("no-such-model", "--steps", "5,x", "--canary", "2")
    assert code == 2, output  # a start still refuses the bad plan, naming it
