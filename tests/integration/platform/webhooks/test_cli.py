"""`kiln webhooks` against a real PostgreSQL: create (guarded), list, update, rotate, deliveries,
redeliver, delete."""

from __future__ import annotations

import uuid
from pathlib import Path

import msgspec
from click.testing import CliRunner

from kiln_platform.cli import kiln


def test_webhook_commands(database_uri: str, tmp_path: Path) -> None:
    runner = CliRunner(env={"KILN_DATABASE_URL": database_uri, "KILN_LOG_LEVEL": "warning",
                            "KILN_WEBHOOK_ALLOW_NETWORKS": "127.0.0.0/8"})  # fmt: skip

    def run(*args: str, code: int = 0, env: dict[str, str] | None = None) -> str:
        result = runner.invoke(kiln(), ["--data-dir", str(tmp_path), *args], env=env)
        assert result.exit_code == code, result.output
        return result.output

    tenant = f"hooks-{uuid.uuid4().hex[:6]}"
    run("tenants", "create", tenant)
    made = msgspec.json.decode(run(
        "webhooks", "create", "--tenant", tenant, "--url", "http://127.0.0.1:9/hook",
        "--event", "batch.failed", "--event", "batch.completed",
    ))  # fmt: skip
    assert made["secret"].startswith("whsec_")
    hook = made["endpoint"]["id"]
    assert made["endpoint"]["events"] == ["batch.completed", "batch.failed"]
    strict = {"KILN_WEBHOOK_ALLOW_NETWORKS": ""}
    refused = run("webhooks", "create", "--tenant", tenant, "--url", "http://127.0.0.1:9/h",
                  "--event", "batch.failed", code=1, env=strict)  # fmt: skip
    assert "KILN_WEBHOOK_ALLOW_NETWORKS" in refused
    run("webhooks", "create", "--tenant", tenant, "--url", "http://x", "--event", "nope", code=2)

    changed = msgspec.json.decode(
        run("webhooks", "update", "--tenant", tenant, hook, "--disable", "--event", "batch.expired")
    )
    assert (changed["enabled"], changed["events"]) == (False, ["batch.expired"])
    [listed] = msgspec.json.decode(run("webhooks", "list", "--tenant", tenant))
    assert "secret" not in listed
    rotated = msgspec.json.decode(run("webhooks", "rotate-secret", "--tenant", tenant, hook))
    assert rotated["secret"] != made["secret"]
    assert rotated["endpoint"]["previous_secret_until"] is not None
    assert msgspec.json.decode(run("webhooks", "deliveries", "--tenant", tenant, hook)) == []
    missing = str(uuid.uuid4())
    assert "No such delivery" in run("webhooks", "redeliver", "--tenant", tenant, hook, missing,
                                     code=1)  # fmt: skip
    run("webhooks", "delete", "--tenant", tenant, hook)
    assert msgspec.json.decode(run("webhooks", "list", "--tenant", tenant)) == []
