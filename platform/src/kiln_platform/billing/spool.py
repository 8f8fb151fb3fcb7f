"""The usage spool: where the ledger keeps usage durably while PostgreSQL is unreachable.

An append-only file per gateway process (``<data dir>/spool/usage-<pid>.jsonl``), one JSON
usage per line, written and fsync'd once per ledger batch (the group commit's batch) before the
requests of that batch answer. When the database is back, ``drain`` renames the file aside
(appends then go to a fresh file), inserts its rows with the ledger's ``ON CONFLICT (request_id)
DO NOTHING`` and deletes it only after the transaction committed: a retried drain, or one that
a crash interrupted, inserts nothing twice. A torn last line (a crash mid-append, before any
request was answered for it) is skipped.

Bounded: the spool accepts rows for ``max_age_s`` after its oldest unwritten row and up to
``max_bytes``; past either it refuses (``accepts`` is False) and the ledger answers 503 again
rather than serving unbilled for ever.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import TYPE_CHECKING, Generic, TypeVar

import msgspec
import structlog

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from pathlib import Path

log = structlog.get_logger("kiln.spool")
_ENCODER = msgspec.json.Encoder()
T = TypeVar("T")


class UsageSpool(Generic[T]):
    """One process's spool file of rows of type ``kind`` (``ledger.Usage``), its bound, and its
    drain."""

    def __init__(
        self, folder: Path, kind: type[T], *, max_age_s: float = 300.0,
        max_bytes: int = 64 << 20, pid: int | None = None,
    ) -> None:  # fmt: skip
        self.folder = folder
        self._decoder = msgspec.json.Decoder(kind)
        self.max_age_s = max_age_s
        self.max_bytes = max_bytes
        self._pid = os.getpid() if pid is None else pid
        self.path = folder / f"usage-{self._pid}.jsonl"
        self._since: float | None = None
        """Monotonic time of the oldest row not yet drained (None: the spool is empty)."""
        self._bytes = 0
        self._left = bool(self._orphans())
        """Files of a drain that failed, or of dead processes (found at start and each drain)."""

    def pending(self) -> bool:
        """Whether rows wait to be drained (this process's, or a dead process's file)."""
        return self._since is not None or self._left

    def accepts(self) -> bool:
        """Whether the spool is within its bound (age of its oldest row, size)."""
        if self._since is None:
            return True
        return time.monotonic() - self._since < self.max_age_s and self._bytes < self.max_bytes

    def append(self, rows: list[T]) -> None:
        """Write rows and fsync them (blocking: run it off the event loop)."""
        data = b"".join(_ENCODER.encode(r) + b"\n" for r in rows)
        self.folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        if self._since is None:
            self._since = time.monotonic()
        self._bytes += len(data)

    async def drain(self, write: Callable[[list[T]], Awaitable[int]]) -> int:
        """Write every spooled row with ``write`` (one transaction per file; returns the rows it
        inserted), deleting each file once written; how many rows were inserted in all.

        A failing ``write`` leaves the file for the next drain (its committed rows, if any, are
        skipped then by their request ids)."""
        files = self._orphans()
        if self._since is not None and self.path.exists():
            aside = self.path.with_suffix(f".{time.time_ns()}.draining")
            self.path.rename(aside)  # later appends start a new file
            self._since, self._bytes = None, 0
            files.append(aside)
        inserted, self._left = 0, True
        for path in files:
            inserted += await write(read(path, self._decoder))
            path.unlink()
        self._left = False
        return inserted

    def _orphans(self) -> list[Path]:
        """Files left to drain: this process's set aside, and dead processes' files."""
        if not self.folder.is_dir():
            return []
        found = []
        for path in sorted(self.folder.glob("usage-*")):
            pid = int(path.name.split(".")[0].removeprefix("usage-"))
            aside = path.suffix == ".draining"
            if (aside and pid == self._pid) or (pid != self._pid and not _alive(pid)):
                found.append(path)
        return found


def read(path: Path, decoder: msgspec.json.Decoder[T]) -> list[T]:
    """The rows in a spool file; a torn last line (a crash mid-append) is skipped."""
    rows = []
    for line in path.read_bytes().splitlines():
        try:
            rows.append(decoder.decode(line))
        except msgspec.DecodeError:
            log.warning("torn usage spool line skipped", path=str(path))
    return rows


def _alive(pid: int) -> bool:
    with contextlib.suppress(PermissionError):  # someone else's process: alive
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
    return True
