"""OIP's ``BYTES`` tensors on the wire: each element, in row-major order, as a 4-byte
little-endian length and its bytes (Triton's binary form, what ``tritonclient`` sends and
reads). ONNX Runtime's string tensors hold text, so elements are UTF-8."""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from collections.abc import Iterable

BYTES = "BYTES"
_LENGTH = struct.Struct("<I")


def pack(values: Iterable[Any]) -> bytes:
    """Elements (``str``, encoded as UTF-8, or ``bytes``) in the wire form."""
    parts = []
    for value in values:
        raw = value.encode() if isinstance(value, str) else bytes(value)
        parts += [_LENGTH.pack(len(raw)), raw]
    return b"".join(parts)


def unpack(data: bytes | memoryview, count: int) -> np.ndarray:
    """``count`` elements of the wire form as a 1-D object array of ``str``; a ``ValueError``
    that says what is wrong when the data is not exactly that (or not UTF-8)."""
    view, offset, out = memoryview(data), 0, np.empty(count, dtype=object)
    for i in range(count):
        if offset + 4 > len(view):
            raise ValueError(f"holds {i} elements, not {count}")
        (size,) = _LENGTH.unpack_from(view, offset)
        start, offset = offset + 4, offset + 4 + size
        if offset > len(view):
            raise ValueError(f"element {i} runs past the end of the data")
        try:
            out[i] = str(view[start:offset], "utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"element {i} is not UTF-8 text") from None
    if offset != len(view):
        raise ValueError(f"has {len(view) - offset} bytes past its {count} elements")
    return out
