"""Token ids -> text pieces: incremental detokenization plus stop strings across token boundaries.

``tokenizers.decoders.DecodeStream`` holds back bytes until they form whole UTF-8 characters, so
multi-byte characters and emoji never surface as replacement characters at chunk boundaries.
On top of it, text that could still be the start of a stop string is held back until it can't.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream


@dataclass(frozen=True, slots=True)
class Detokenizing:
    """How a request's tokens become its text: its ``stop`` strings (vLLM's
    ``include_stop_str_in_output``: the one met ends the text, kept), whether special
    tokens are left out (vLLM's ``skip_special_tokens``, the default), and how many tokens
    come before a stop string may end it (vLLM's ``min_tokens``)."""

    stop: tuple[str, ...] = ()
    include_stop: bool = False
    skip_special: bool = True
    min_tokens: int = 0
    stop_ids: tuple[int, ...] = ()
    """The request's ``stop_token_ids`` (vLLM's ``stop_reason`` names the one met)."""

    def stream(self, tokenizer: Tokenizer) -> TextStream:
        """A choice's text stream."""
        return TextStream(tokenizer, self.stop, include_stop=self.include_stop,
                          skip_special=self.skip_special, min_tokens=self.min_tokens,
                          stop_ids=self.stop_ids)  # fmt: skip


@dataclass
class TextStream:
    """Feed token ids, get text that is safe to send; ``stopped`` once a stop string is seen."""

    tokenizer: Tokenizer
    stop: tuple[str, ...] = ()
    stopped: bool = False
    stop_ids: tuple[int, ...] = ()
    matched: str | None = None
    """The stop string that ended the text."""
    include_stop: bool = False
    skip_special: bool = True
    min_tokens: int = 0
    """No stop string ends the text before this many tokens (as vLLM: one may end on the
    ``min_tokens``-th token, and begin before it)."""
    _decoder: DecodeStream = field(init=False)
    _held: str = ""
    _made: int = 0

    def __post_init__(self) -> None:
        self._decoder = DecodeStream(skip_special_tokens=self.skip_special)

    def push(self, token_ids: list[int]) -> str:
        """Text made final by these tokens (possibly empty)."""
        if self.stopped:
            return ""
        early = ""  # released before ``min_tokens``, unsearched
        for token_id in token_ids:
            piece = self._decoder.step(self.tokenizer, token_id)
            self._made += 1
            if piece:
                self._held += piece
            if self._made < self.min_tokens:
                early += self._release(search=False)
        return early + self._release()

    def reason(self, token: int | None) -> str | int | None:
        """vLLM's ``stop_reason`` of a text that ended (on the stop token ``token``, if one):
        the stop string met, or the ``stop_token_ids`` entry (``None``: an end-of-sequence
        token, or a limit)."""
        if self.matched is not None:
            return self.matched
        return token if token in self.stop_ids else None

    def flush(self) -> str:
        """Everything still held back (at the end of generation)."""
        if self.stopped:
            return ""
        text, self._held = self._held, ""
        return text

    def _release(self, *, search: bool = True) -> str:
        """Held text that cannot be part of a stop string; with ``search``, up to the first
        stop string found (which stops the stream)."""
        if not self.stop:
            text, self._held = self._held, ""
            return text
        found = ((self._held.find(s), s) for s in self.stop) if search else ()
        hits = [(i, i + len(s)) for i, s in found if i >= 0]
        if hits:
            self.stopped = True
            start, end = min(hits)
            self.matched = self._held[start:end]
            text, self._held = self._held[: end if self.include_stop else start], ""
            return text
        keep = longest_stop_prefix_suffix(self._held, self.stop)
        cut = len(self._held) - keep
        text, self._held = self._held[:cut], self._held[cut:]
        return text


def longest_stop_prefix_suffix(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of some stop string."""
    best = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:n]):
                best = n
                break
    return best
