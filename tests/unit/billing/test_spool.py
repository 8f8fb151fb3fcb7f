"""The usage spool: rows fsync'd to a local file during an outage, drained exactly once."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import msgspec
import pytest

from kiln_platform.billing.ledger import Usage
from kiln_platform.billing.spool import UsageSpool, read

if TYPE_CHECKING:
    from pathlib import Path

TENANT = uuid.uuid4()
AT = datetime.now(UTC)


def _usage(i: int) -> Usage:
    return Usage(f"req-{i}", TENANT, None, "m", "1", "embeddings", 200, input_tokens=i, at=AT)


class Ledger:
    """Stands in for the database side of a drain: rows kept by request id (ON CONFLICT DO
    NOTHING), optionally failing after the insert (the commit's outcome lost)."""

    def __init__(self) -> None:
        self.rows: dict[str, Usage] = {}
        self.fail = False

    async def write(self, rows: list[Usage]) -> int:
        new = [r for r in rows if r.request_id not in self.rows]
        self.rows.update((r.request_id, r) for r in new)
        if self.fail:
            raise ConnectionResetError("connection lost after the commit")
        return len(new)


async def test_rows_round_trip_and_drain_empties_the_spool(tmp_path: Path) -> None:
    spool, ledger = UsageSpool(tmp_path, Usage), Ledger()
    spool.append([_usage(1), _usage(2)])
    spool.append([_usage(3)])
    assert spool.pending()
    assert read(spool.path, msgspec.json.Decoder(Usage)) == [_usage(1), _usage(2), _usage(3)]
    assert await spool.drain(ledger.write) == 3
    assert ledger.rows == {f"req-{i}": _usage(i) for i in (1, 2, 3)}
    assert not spool.pending()
    assert os.listdir(tmp_path) == []


async def test_a_drain_retried_after_a_failure_inserts_nothing_twice(tmp_path: Path) -> None:
    spool, ledger = UsageSpool(tmp_path, Usage), Ledger()
    spool.append([_usage(1), _usage(2)])
    ledger.fail = True
    with pytest.raises(ConnectionResetError):
        await spool.drain(ledger.write)
    assert spool.pending(), "the file stays until a drain succeeds"
    spool.append([_usage(3)])  # appended while the first file waits
    ledger.fail = False
    assert await spool.drain(ledger.write) == 1
    assert sorted(ledger.rows) == ["req-1", "req-2", "req-3"]
    assert not spool.pending()


@pytest.fixture
def dead_pid() -> int:
    """The pid of a process that has exited."""
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    return int(dead.stdout)


async def test_a_dead_process_spool_is_drained_once_and_a_torn_line_skipped(
    tmp_path: Path, dead_pid: int
) -> None:
    crashed = UsageSpool(tmp_path, Usage, pid=dead_pid)
    crashed.append([_usage(1), _usage(2)])
    with crashed.path.open("ab") as f:  # the crash cut the next append mid-line
        f.write(b'{"request_id":"req-3","tena')
    spool, ledger = UsageSpool(tmp_path, Usage), Ledger()
    assert spool.pending()
    assert await spool.drain(ledger.write) == 2
    assert await spool.drain(ledger.write) == 0
    assert sorted(ledger.rows) == ["req-1", "req-2"]


async def test_a_live_process_spool_is_left_to_it(tmp_path: Path) -> None:
    other = UsageSpool(tmp_path, Usage, pid=os.getppid())
    other.append([_usage(1)])
    spool = UsageSpool(tmp_path, Usage)
    assert not spool.pending()
    assert await spool.drain(Ledger().write) == 0
    assert other.path.exists()


def test_the_spool_refuses_past_its_age_or_size(tmp_path: Path) -> None:
    assert UsageSpool(tmp_path / "a", Usage, max_age_s=0.0).accepts(), "an empty spool accepts"
    aged = UsageSpool(tmp_path / "a", Usage, max_age_s=0.0)
    aged.append([_usage(1)])
    assert not aged.accepts()
    full = UsageSpool(tmp_path / "b", Usage, max_bytes=500)  # one row is ~360 bytes
    full.append([_usage(1)])
    assert full.accepts()
    full.append([_usage(2)])
    assert not full.accepts()
