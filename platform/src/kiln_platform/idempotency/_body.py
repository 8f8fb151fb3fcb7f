"""A request body read ahead of the route (to fingerprint it), then handed to the route as if
unread. Past ``SPOOL_BYTES`` it goes to a temporary file, so a model upload is not held in
memory. It is never more than the route's limit: ``receive`` is ``body_limit``'s, which raises
``PayloadTooLarge`` past it (the middleware renders it as the API's 413)."""

from __future__ import annotations

import asyncio
import tempfile
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    import hmac
    from collections.abc import AsyncIterator

    from litestar.types import HTTPRequestEvent, Receive, ReceiveMessage

SPOOL_BYTES = 1 << 20
CHUNK = 1 << 20


class ClientGone(Exception):
    """The client disconnected before sending its whole body."""


class Body:
    """The read-ahead body: in memory, or spooled to a temporary file."""

    def __init__(self) -> None:
        self._chunks: list[bytes] = []
        self._size = 0
        self._file: IO[bytes] | None = None

    @classmethod
    async def read(cls, receive: Receive, mac: hmac.HMAC) -> Body:
        """Receive the whole body, feeding it to ``mac``."""
        body = cls()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                body.close()
                raise ClientGone
            chunk: bytes = message.get("body", b"")  # type: ignore[assignment]
            if chunk:
                mac.update(chunk)
                await body._add(chunk)
            if not message.get("more_body", False):
                return body

    async def _add(self, chunk: bytes) -> None:
        self._size += len(chunk)
        if self._file is None and self._size <= SPOOL_BYTES:
            self._chunks.append(chunk)
            return
        if self._file is None:
            self._file = tempfile.TemporaryFile()  # noqa: SIM115 - closed by close()
            for held in self._chunks:
                await asyncio.to_thread(self._file.write, held)
            self._chunks = []
        await asyncio.to_thread(self._file.write, chunk)

    def receive(self, downstream: Receive) -> Receive:
        """A ``receive`` that replays the body, then defers to the client (disconnects)."""
        pending = self._pieces()

        async def replay() -> ReceiveMessage:
            piece = await anext(pending, None)
            if piece is None:
                return await downstream()
            chunk, more = piece
            message: HTTPRequestEvent = {"type": "http.request", "body": chunk, "more_body": more}
            return message

        return replay

    async def _pieces(self) -> AsyncIterator[tuple[bytes, bool]]:
        if self._file is None:
            yield b"".join(self._chunks), False
            return
        await asyncio.to_thread(self._file.seek, 0)
        left = self._size
        while left > 0:
            chunk = await asyncio.to_thread(self._file.read, min(CHUNK, left))
            left -= len(chunk)
            yield chunk, left > 0

    def close(self) -> None:
        """Drop the temporary file, if any."""
        if self._file is not None:
            self._file.close()
            self._file = None
