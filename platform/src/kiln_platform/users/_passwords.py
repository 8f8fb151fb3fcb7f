"""Argon2 password hashing off the event loop, a few hashes at a time, at the lowest CPU
priority.

An argon2 check takes tens of milliseconds of CPU on several threads (one per lane) and 64 MiB:
on the event loop, a sign-in flood would stall every request the gateway serves. Hashes run on
``HASHES_AT_ONCE`` dedicated threads (argon2-cffi releases the GIL) whose nice value is 19, which
the lane threads libargon2 starts inherit: a flood queues for them instead of occupying every
thread, and inference keeps the cores (bench/signin_flood.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError
from prometheus_client import Counter

HASHES_AT_ONCE = max(1, min(4, (os.cpu_count() or 2) // 2))
CHECKS = Counter(
    "kiln_console_password_checks", "Console passwords checked against a hash (argon2 verify)."
)
_hasher = PasswordHasher()
_DUMMY = _hasher.hash("kiln-timing-equalizer")


def _lowest_priority() -> None:
    """Run this thread (and the threads it starts) at nice 19, where the OS allows it."""
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)


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
    return await asyncio.get_running_loop().run_in_executor(_pool, _verify, password_hash, password)


async def hash_password(password: str) -> str:
    """An argon2 hash of ``password``."""
    return await asyncio.get_running_loop().run_in_executor(_pool, _hasher.hash, password)
