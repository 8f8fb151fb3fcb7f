"""What a database outage looks like from the request path.

``unreachable(exc)`` tells a failure to reach PostgreSQL (refused or dropped connections, the
server shutting down, a connect timeout) from the database refusing a statement: only the
former lets a service fall back to what it holds in memory (``docs/reliability.md``).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import MutableMapping
from typing import Any

import asyncpg
import structlog
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

_GONE = (
    OSError,
    TimeoutError,
    asyncpg.exceptions.ConnectionDoesNotExistError,
    asyncpg.exceptions.CannotConnectNowError,
    asyncpg.exceptions.AdminShutdownError,
    asyncpg.exceptions.ConnectionFailureError,
    asyncpg.exceptions.InterfaceError,
)


def unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` means PostgreSQL could not be reached (not that it refused a statement)."""
    if isinstance(exc, DBAPIError):
        if exc.connection_invalidated or isinstance(exc, (OperationalError, InterfaceError)):
            return True
        orig = exc.orig
        return isinstance(orig, _GONE) or (orig is not None and isinstance(orig.__cause__, _GONE))
    return isinstance(exc, _GONE)


DB_UNREACHABLE = "Kiln's database is unreachable; this request needs it. Retry shortly."
"""The message of the 503 a request that needs the database gets during an outage."""
QUIET_S = 60.0
"""How often one log event caused by an unreachable database is written (with no traceback)."""
_last_logged: dict[str, float] = {}


def quiet_outage_logs(_: object, __: str, event: MutableMapping[str, Any]) -> Any:
    """A structlog processor: a background loop's failure because the database is unreachable
    is logged once a minute per event, as one line without its traceback (no log flood)."""
    exc_info = event.get("exc_info")
    exc = sys.exc_info()[1] if exc_info is True else exc_info
    if not isinstance(exc, BaseException) or not unreachable(exc):
        return event
    now, name = time.monotonic(), str(event.get("event"))
    if now - _last_logged.get(name, -math.inf) < QUIET_S:
        raise structlog.DropEvent
    _last_logged[name] = now
    event.pop("exc_info")
    event["error"] = f"database unreachable ({type(exc).__name__}); repeats muted for {QUIET_S:g} s"
    return event
