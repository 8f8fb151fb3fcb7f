"""Argon2 password hashing off the event loop, a few hashes at a time, in the CPU time
inference leaves over, and at most half of it.

An argon2 check takes ~130 ms of CPU on several threads (one per lane) and sweeps 64 MiB: on the
event loop, a sign-in flood would stall every request the gateway serves. Hashes run on
``HASHES_AT_ONCE`` dedicated threads (argon2-cffi releases the GIL) under ``SCHED_IDLE`` (nice 19
where that is refused), which the lane threads libargon2 starts inherit: the kernel hands the
core to any other thread the moment it wakes, where a nice-19 thread keeps it to the end of its
slice. Each thread then rests as long as its last check took before the next (``REST``), because
idle priority does not protect what a check shares with inference: the 64 MiB sweeps evict
caches and take memory bandwidth. A flood queues for these threads instead of taking the cores;
``bench/signin_flood.py`` measures it (docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError
from prometheus_client import Counter

HASHES_AT_ONCE = max(1, min(4, (os.cpu_count() or 2) // 2))
REST = 1.0
"""How long a hashing thread rests before its next check, in multiples of its last check's time."""
CHECKS = Counter(
    "kiln_console_password_checks", "Console passwords checked against a hash (argon2 verify)."
)
_hasher = PasswordHasher()
_DUMMY = _hasher.hash("kiln-timing-equalizer")


T = TypeVar("T")
_rest = threading.local()


def _lowest_priority() -> None:
    """Run this thread (and the threads it starts) at idle priority, else at nice 19, where the
    OS allows either."""
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    with contextlib.suppress(AttributeError, OSError):
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # this thread on Linux
    _rest.until = 0.0


def _paced(work: Callable[..., T], *args: str | None) -> T:
    """``work(*args)`` once this thread has rested ``REST`` times as long as its last run took
    (a lone sign-in never waits: the rest is over before it comes)."""
    time.sleep(max(0.0, _rest.until - time.monotonic()))
    start = time.monotonic()
    try:
        return work(*args)
    finally:
        end = time.monotonic()
        _rest.until = end + (end - start) * REST


_pool = ThreadPoolExecutor(HASHES_AT_ONCE, "kiln-argon2", initializer=_lowest_priority)


def _verify(password_hash: str | None, password: str) -> bool:
    try:
        _hasher.verify(password_hash or _DUMMY, password)
    except (VerificationError, InvalidHashError):
        return False
    return password_hash is not None


async def verify(password_hash: str | None, password: str) -> bool:
    """The password matches the hash (None, no such user: the same work, then False)."""
    CHECKS.inc()
    return await asyncio.get_running_loop().run_in_executor(
        _pool, _paced, _verify, password_hash, password
    )


async def hash_password(password: str) -> str:
    """An argon2 hash of ``password``."""
    return await asyncio.get_running_loop().run_in_executor(_pool, _paced, _hasher.hash, password)
