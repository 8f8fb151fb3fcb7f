"""Batch input lines: each checked on its own, errors naming the line (pure, no I/O)."""

from __future__ import annotations

import msgspec

from kiln_platform.batches.schemas import ENDPOINTS, InputLine
from kiln_platform.errors import BadRequest
from kiln_platform.quotas.batch_policy import line_tokens

MAX_CUSTOM_ID = 512
_decoder = msgspec.json.Decoder(InputLine)


def refuse(n: int, message: str, param: str | None = None) -> BadRequest:
    """A 400 about line ``n`` (1-based)."""
    return BadRequest(f"Line {n}: {message}", param=param or f"line {n}")


def check_line(n: int, raw: bytes | str) -> InputLine:
    """Decode and check line ``n``: ``custom_id``, ``method`` POST, a batch ``url``, a
    ``body`` naming its ``model``."""
    try:
        item = _decoder.decode(raw)
    except msgspec.ValidationError as exc:
        raise refuse(n, f"{exc}.") from None
    except msgspec.DecodeError:
        raise refuse(n, "not a valid JSON object.") from None
    if not item.custom_id or len(item.custom_id) > MAX_CUSTOM_ID:
        raise refuse(n, f"'custom_id' must have 1 to {MAX_CUSTOM_ID} characters.")
    if item.method != "POST":
        raise refuse(n, f"'method' is {item.method!r}; batches run POST requests only.")
    if item.url not in ENDPOINTS:
        raise refuse(n, f"'url' is {item.url!r}; batches run {', '.join(ENDPOINTS)}.")
    if not isinstance(item.body.get("model"), str):
        raise refuse(n, "'body.model' must name a model.")
    return item


class LineChecker:
    """Checks a JSONL body as its bytes arrive: every complete line, unique ``custom_id``s,
    at most ``max_lines`` lines of at most ``max_line_bytes`` each."""

    def __init__(self, max_lines: int, max_line_bytes: int) -> None:
        self._max_lines = max_lines
        self._max_line = max_line_bytes
        self._partial = bytearray()
        self._ids: set[str] = set()
        self._number = 0
        self.lines = 0
        """Requests (non-blank lines) so far."""
        self.tokens = 0
        """Their estimated tokens (``quotas.batch_policy.line_tokens``)."""

    def feed(self, data: bytes) -> None:
        """Check the lines ``data`` completes; keep the rest for the next call."""
        self._partial += data
        start = 0
        while (end := self._partial.find(b"\n", start)) >= 0:
            self._line(bytes(self._partial[start:end]))
            start = end + 1
        del self._partial[:start]
        if len(self._partial) > self._max_line:
            raise refuse(self._number + 1, f"longer than {self._max_line} bytes.")

    def finish(self) -> int:
        """Check the last line (no newline after it); the number of requests."""
        if self._partial:
            self._line(bytes(self._partial))
        if not self.lines:
            raise BadRequest("The file has no lines.", param="file")
        return self.lines

    def _line(self, raw: bytes) -> None:
        n = self._number = self._number + 1
        if not raw.strip():  # blank lines are skipped (numbered, as the runner numbers them)
            return
        self.lines += 1
        if self.lines > self._max_lines:
            raise BadRequest(f"The file has more than {self._max_lines} lines.", param="file")
        if len(raw) > self._max_line:
            raise refuse(n, f"longer than {self._max_line} bytes.")
        item = check_line(n, raw)
        if item.custom_id in self._ids:
            raise refuse(n, f"'custom_id' {item.custom_id!r} appears on an earlier line.")
        self._ids.add(item.custom_id)
        self.tokens += line_tokens(item.body)
