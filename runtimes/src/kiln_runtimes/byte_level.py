"""GPT-2's byte-level alphabet, which byte-level BPE vocabularies (GPT-2's, Llama 3's, Qwen's)
write their tokens in: a printable character for each byte."""

from __future__ import annotations


def _alphabet() -> dict[int, str]:
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    extra = iter(range(256, 512))
    return {b: chr(b if b in printable else next(extra)) for b in range(256)}


CHAR_OF = _alphabet()
"""Byte -> the character a byte-level vocabulary writes it as."""
BYTE_OF = {c: b for b, c in CHAR_OF.items()}
"""The reverse: a byte-level token's character -> the byte it stands for."""
