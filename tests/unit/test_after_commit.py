"""Deferred work runs once, in order, awaited when it is a coroutine."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from kiln_platform.db import after_commit


async def test_deferred_actions_run_once_in_order() -> None:
    session: Any = SimpleNamespace(info={})
    done: list[str] = []

    async def reconcile() -> None:
        done.append("reconcile")

    after_commit.defer(session, lambda: done.append("forget"))
    after_commit.defer(session, reconcile)
    assert done == []  # nothing before the owner of the transaction says it committed
    await after_commit.run(session)
    await after_commit.run(session)
    assert done == ["forget", "reconcile"]
