"""What counts as the database being unreachable, and its muted logs."""

from __future__ import annotations

import asyncpg
import pytest
import structlog
from sqlalchemy.exc import IntegrityError, OperationalError

from kiln_platform.db import outage


def test_connection_failures_are_unreachable_and_refused_statements_are_not() -> None:
    assert outage.unreachable(FileNotFoundError(2, "no socket"))
    assert outage.unreachable(ConnectionRefusedError())
    assert outage.unreachable(OperationalError("SELECT 1", {}, Exception("gone")))
    wrapped = Exception("adapted")
    wrapped.__cause__ = asyncpg.exceptions.ConnectionDoesNotExistError("closed")
    assert outage.unreachable(IntegrityError("x", {}, wrapped))
    assert not outage.unreachable(IntegrityError("x", {}, Exception("duplicate key")))
    assert not outage.unreachable(ValueError("bad"))


def test_an_outage_log_line_has_no_traceback_and_repeats_are_dropped() -> None:
    outage._last_logged.clear()
    exc = ConnectionRefusedError()
    line = outage.quiet_outage_logs(None, "error", {"event": "loop failed", "exc_info": exc})
    assert "exc_info" not in line
    assert "database unreachable" in line["error"]
    with pytest.raises(structlog.DropEvent):
        outage.quiet_outage_logs(None, "error", {"event": "loop failed", "exc_info": exc})
    other = {"event": "loop failed", "exc_info": ValueError("a bug")}
    assert outage.quiet_outage_logs(None, "error", other) is other, "other errors keep theirs"
