"""Argon2 password hashing off the event loop, a few hashes at a time.

An argon2 check takes tens of milliseconds of CPU and 64 MiB: on the event loop, a sign-in
flood would stall every request the gateway serves. Hashes run in worker threads (argon2-cffi
releases the GIL), at most ``HASHES_AT_ONCE`` together, so a flood waits its turn instead of
occupying every thread and all the memory.
"""

from __future__ import annotations

import asyncio
import os
from weakref import WeakKeyDictionary

import anyio
from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError
from prometheus_client import Counter

HASHES_AT_ONCE = max(1, min(4, (os.cpu_count() or 2) // 2))
CHECKS = Counter(
    "kiln_console_password_checks", "Console passwords checked against a hash (argon2 verify)."
)
_hasher = PasswordHasher()
_DUMMY = _hasher.hash("kiln-timing-equalizer")
_limiters: WeakKeyDictionary[asyncio.AbstractEventLoop, anyio.CapacityLimiter] = WeakKeyDictionary()


def _limiter() -> anyio.CapacityLimiter:
    """The event loop's limiter (asyncio primitives belong to one loop; tests run several)."""
    loop = asyncio.get_running_loop()
    if loop not in _limiters:
        _limiters[loop] = anyio.CapacityLimiter(HASHES_AT_ONCE)
    return _limiters[loop]


def _verify(password_hash: str | None, password: str) -> bool:
    try:
        _hasher.verify(password_hash or _DUMMY, password)
    except (VerificationError, InvalidHashError):
        return False
    return password_hash is not None


async def verify(password_hash: str | None, password: str) -> bool:
    """The password matches the hash (None, no such user: the same work, then False)."""
    CHECKS.inc()
    return await anyio.to_thread.run_sync(_verify, password_hash, password, limiter=_limiter())


async def hash_password(password: str) -> str:
    """An argon2 hash of ``password``."""
    return await anyio.to_thread.run_sync(_hasher.hash, password, limiter=_limiter())
