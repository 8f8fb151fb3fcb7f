"""The head revision is read from the migration scripts once per process: readiness probes ask
for it every few seconds, and each read loaded every script (issue 23's soak)."""

from __future__ import annotations

import pytest
from alembic.script import ScriptDirectory

from kiln_platform.db import migrate


def test_the_scripts_are_read_once(monkeypatch: pytest.MonkeyPatch) -> None:
    reads = 0
    real = ScriptDirectory.from_config

    def counted(*args: object, **kwargs: object) -> ScriptDirectory:
        nonlocal reads
        reads += 1
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ScriptDirectory, "from_config", counted)
    heads = {migrate.head_revision() for _ in range(20)}
    assert reads <= 1
    assert len(heads) == 1
    assert heads.pop() is not None
