"""``kiln quotas set`` / ``show`` against a real PostgreSQL: the batch limits beside the others."""

from __future__ import annotations

import uuid
from pathlib import Path

import msgspec
from click.testing import CliRunner

from kiln_platform.cli import kiln


def test_batch_limits_are_set_and_shown(database_uri: str, tmp_path: Path) -> None:
    runner = CliRunner(env={"KILN_DATABASE_URL": database_uri, "KILN_LOG_LEVEL": "warning"})

    def run(*args: str, code: int = 0) -> str:
        result = runner.invoke(kiln(), ["--data-dir", str(tmp_path), *args])
        assert result.exit_code == code, result.output
        return result.output

    tenant = f"q-{uuid.uuid4().hex[:6]}"
    run("tenants", "create", tenant)
    run("quotas", "set", "--tenant", tenant, "--rpm", "60")
    out = run("quotas", "set", "--tenant", tenant, "--batch-tokens-per-day", "5000000",
              "--batch-enqueued-tokens", "90000")  # fmt: skip
    assert "rpm=60" in out  # kept
    assert "batch_tokens_per_day=5000000 batch_enqueued_tokens=90000" in out
    limits = msgspec.json.decode(run("quotas", "show", "--tenant", tenant))["limits"]
    assert (limits["rpm"], limits["batch_tokens_per_day"], limits["batch_enqueued_tokens"]) == (
        60, 5_000_000, 90_000)  # fmt: skip
    run("quotas", "set", "--tenant", tenant, "--batch-enqueued-tokens", "0", code=2)
