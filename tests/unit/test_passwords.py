"""Password hashing: right and wrong passwords, off the loop at idle priority, paced."""

from __future__ import annotations

import asyncio
import os
import sys
import time

import pytest

from kiln_platform.users import _passwords


async def test_a_hash_verifies_its_password_only() -> None:
    hashed = await _passwords.hash_password("correct horse")
    assert await _passwords.verify(hashed, "correct horse")
    assert not await _passwords.verify(hashed, "wrong horse")
    assert not await _passwords.verify(None, "correct horse")  # no such user: same work, False


@pytest.mark.skipif(sys.platform != "linux", reason="SCHED_IDLE is Linux's")
async def test_hashing_threads_run_at_idle_priority() -> None:
    loop = asyncio.get_running_loop()
    policy = await loop.run_in_executor(_passwords._pool, os.sched_getscheduler, 0)
    assert policy == os.SCHED_IDLE


async def test_a_thread_rests_as_long_as_its_last_check_took() -> None:
    loop = asyncio.get_running_loop()
    runs: list[tuple[float, float]] = []

    def check(_: str | None) -> None:
        start = time.monotonic()
        time.sleep(0.05)
        runs.append((start, time.monotonic()))

    def twice() -> None:  # two checks back to back on one pool thread
        _passwords._paced(check, None)
        _passwords._paced(check, None)

    await loop.run_in_executor(_passwords._pool, twice)
    (_, first_end), (second_start, _) = runs
    assert second_start - first_end >= 0.05 * _passwords.REST
