"""Group commit of finished batch lines, as the ledger's for requests: one transaction
(``lines.record``) writes every line that finished during the last ``KILN_BATCH_RECORD_S``
(or the last write).

A transaction per line cost the gateway's event loop more than running the line did (on the
loop interactive requests share: BEGIN, a ping, the inserts, COMMIT, a round trip each) and
PostgreSQL ~2 ms of CPU (``bench/batches.py``, docs/benchmarks.md). With one or two lines in flight
a group of only the lines finishing during a write is one or two lines, so a group waits
``KILN_BATCH_RECORD_S`` (0.1 s) for more after its first: the lines that finish meanwhile
share its transaction. A line's ``record`` answers once its group is committed, so what a
caller does after it (count the line) still happens only for a durable line; the runner bounds
the lines waiting here (``GROUP``), as a crash loses them (they run again).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

from kiln_platform.batches import lines

if TYPE_CHECKING:
    from kiln_platform.context import Kiln

_Pending = tuple[lines.Line, lines.Outcome, asyncio.Future[bool]]
GROUP = 32
"""A group this large is written at once; the runner starts no line while this many wait."""


class LineRecorder:
    """Records lines in groups: the first finished line starts a group, written ``linger_s``
    later (or once it has ``GROUP`` lines) with every line that finished meanwhile."""

    def __init__(self, kiln: Kiln, linger_s: float = 0.0) -> None:
        self._kiln = kiln
        self._linger_s = linger_s
        self._pending: list[_Pending] = []
        self._full = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None

    async def record(self, line: lines.Line, outcome: lines.Outcome) -> bool:
        """Record ``line`` with its group; False if another run recorded it first. A failed
        write raises here, for each line of its group (none of them is recorded)."""
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._pending.append((line, outcome, done))
        if len(self._pending) >= GROUP:
            self._full.set()
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write(), name="batch-line-recorder")
        return await done

    async def _write(self) -> None:
        while self._pending:
            if len(self._pending) < GROUP and self._linger_s > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._full.wait(), self._linger_s)
            self._full.clear()
            group, self._pending = self._pending, []
            try:
                firsts = await lines.record(self._kiln, [(ln, o) for ln, o, _ in group])
            except Exception as exc:  # each line's runner logs it and leaves the line unrecorded
                for *_, done in group:
                    if not done.done():
                        done.set_exception(exc)
                continue
            for (*_, done), first in zip(group, firsts, strict=True):
                if not done.done():
                    done.set_result(first)

    async def stop(self) -> None:
        """Stop a write in progress (its transaction rolls back: its lines run again)."""
        if self._writer is not None:
            self._writer.cancel()
            await asyncio.gather(self._writer, return_exceptions=True)
