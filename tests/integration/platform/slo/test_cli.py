"""`kiln slo` and `kiln alerts` against a real PostgreSQL: create, list, status, rules, delete."""

from __future__ import annotations

from pathlib import Path

import msgspec
import yaml
from click.testing import CliRunner

from kiln_platform.cli import kiln


def test_slo_commands(database_uri: str, tmp_path: Path) -> None:
    runner = CliRunner(env={"KILN_DATABASE_URL": database_uri, "KILN_LOG_LEVEL": "warning"})

    def run(*args: str, code: int = 0, env: dict[str, str] | None = None) -> str:
        result = runner.invoke(kiln(), ["--data-dir", str(tmp_path), *args], env=env)
        assert result.exit_code == code, result.output
        return result.output

    made = msgspec.json.decode(run(
        "slo", "create", "minilm-up", "--model", "all-minilm-l6-v2", "--availability", "0.999",
        "--latency", "0.99", "--latency-ms", "300", "--period-days", "7",
    ))  # fmt: skip
    assert (made["name"], made["period_days"]) == ("minilm-up", 7)
    assert "minilm-up\tall-minilm-l6-v2\t*" in run("slo", "list")
    status = msgspec.json.decode(run("slo", "status", "minilm-up"))
    assert [s["budget_remaining"] for s in status["slis"]] == [1.0, 1.0]
    assert status["firing"] == []
    rules = yaml.safe_load(run("slo", "rules"))
    [group] = rules["groups"]
    assert group["name"] == "kiln-slo-minilm-up"
    assert sum("alert" in r for r in group["rules"]) == 4  # page + ticket, per SLI
    assert run("alerts", "list") == ""
    assert "already exists" in run(
        "slo", "create", "minilm-up", "--model", "m", "--availability", "0.9", code=1
    )
    run("slo", "create", "bad", "--model", "m", "--availability", "1.5", code=2)
    derived = run("slo", "webhook-secret").strip()
    assert len(derived) == 64  # HMAC-SHA256 of the server secret, hex
    assert derived == run("slo", "webhook-secret").strip()
    chosen = {"KILN_ALERT_WEBHOOK_SECRET": "chosen"}
    assert run("slo", "webhook-secret", env=chosen) == "chosen\n"
    run("slo", "delete", "minilm-up")
    assert run("slo", "list") == ""
