"""A ``multipart/form-data`` upload streamed to a staging file, its JSONL checked on the way."""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

from multipart import MultipartSegment, ParserError, ParserLimitReached, PushMultipartParser

from kiln_platform.batches.jsonl import LineChecker
from kiln_platform.errors import BadRequest, PayloadTooLarge

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

MAX_FIELD = 1024
"""The most bytes of a form field that is not the file (``purpose``)."""


class Staged:
    """The ``file`` part being written to ``path``: its size, sha256 and checked lines."""

    def __init__(self, path: Path, max_bytes: int, checker: LineChecker) -> None:
        self.path = path
        self.size = 0
        self.filename = ""
        self._max = max_bytes
        self._hash = hashlib.sha256()
        self._checker = checker
        self._out = path.open("wb")

    def write(self, data: bytes) -> None:
        """Append ``data``; 413 past the limit, 400 naming the first bad line."""
        self.size += len(data)
        if self.size > self._max:
            raise PayloadTooLarge(f"The file exceeds the {self._max}-byte limit.")
        self._checker.feed(data)
        self._hash.update(data)
        self._out.write(data)

    def finish(self) -> tuple[int, str]:
        """Close the file; its line count and hex sha256."""
        self._out.close()
        return self._checker.finish(), self._hash.hexdigest()

    def close(self) -> None:
        """Close the file (however the upload ended)."""
        self._out.close()


async def receive(chunks: AsyncIterator[bytes], boundary: bytes, staged: Staged) -> dict[str, str]:
    """Stream the form: its ``file`` part into ``staged``, the other fields returned."""
    form = _Form(staged)
    try:
        with PushMultipartParser(boundary, max_segment_count=8) as parser:
            async for chunk in _then_end(chunks):
                for part in parser.parse(chunk):
                    form.take(part)
                if parser.closed:
                    break
    except (ParserError, ParserLimitReached) as exc:
        raise BadRequest("Invalid multipart/form-data.") from exc
    if not form.seen_file:
        raise BadRequest("The form has no 'file' part.", param="file")
    return form.fields


class _Form:
    """The parts of a form as the parser yields them: a header, its data, an empty end."""

    def __init__(self, staged: Staged) -> None:
        self.fields: dict[str, str] = {}
        self.seen_file = False
        self._staged = staged
        self._segment: MultipartSegment | None = None
        self._value = bytearray()

    def take(self, part: MultipartSegment | bytearray | None) -> None:
        segment = self._segment
        if isinstance(part, MultipartSegment):
            self._start(part)
        elif segment is None:
            raise BadRequest("Invalid multipart/form-data.")
        elif not part:
            if segment.name != "file":
                self.fields[segment.name] = self._value.decode(errors="replace")
            self._segment = None
        elif segment.name == "file":
            self._staged.write(bytes(part))
        elif len(self._value) + len(part) <= MAX_FIELD:
            self._value += part
        else:
            raise BadRequest(f"'{segment.name}' is too long.", param=segment.name)

    def _start(self, segment: MultipartSegment) -> None:
        self._segment, self._value = segment, bytearray()
        if segment.name == "file":
            if self.seen_file:
                raise BadRequest("Send one file per upload.", param="file")
            self.seen_file, self._staged.filename = True, segment.filename or "upload.jsonl"


async def _then_end(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The body's chunks, then ``b""`` (the parser's end of input)."""
    async for chunk in chunks:
        if chunk:
            yield chunk
    yield b""
