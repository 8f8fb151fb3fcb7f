"""A local worker's environment: the ``s3://`` store and the ``AWS_*`` settings to read it
with reach workers only when the gateway has such a store; the gateway's secrets never do."""

from __future__ import annotations

from pathlib import Path

from pydantic import SecretStr

from kiln_platform.pools.backend import worker_environment
from kiln_platform.settings import Settings
from kiln_runtimes.store import CACHE_MAX_ENV, STORE_ENV

PARENT = {"PATH": "/bin", "AWS_ACCESS_KEY_ID": "key", "AWS_ENDPOINT_URL": "http://s3:9000",
          "KILN_SECRET_KEY": "gateway-only", "KILN_DATABASE_URL": "postgresql://x"}  # fmt: skip


def test_workers_get_the_store_and_aws_settings_only_with_an_s3_store() -> None:
    base = {"data_dir": Path("/data"), "secret_key": SecretStr("s")}
    plain = worker_environment(Settings(**base), PARENT)  # type: ignore[arg-type]
    assert not [k for k in plain if k.startswith("AWS_") or k == STORE_ENV]
    shared = worker_environment(
        Settings(**base, artifact_store="s3://b/kiln", artifact_cache_max_bytes=7),  # type: ignore[arg-type]
        PARENT,
    )
    assert shared[STORE_ENV] == "s3://b/kiln"
    assert shared[CACHE_MAX_ENV] == "7"
    assert shared["AWS_ACCESS_KEY_ID"] == "key"
    assert shared["AWS_ENDPOINT_URL"] == "http://s3:9000"
    assert "KILN_SECRET_KEY" not in shared
    assert "KILN_DATABASE_URL" not in shared
