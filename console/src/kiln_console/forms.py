"""Form fields into the admin API's own msgspec structs, so the console validates exactly as
``/admin/v1`` does and a bad field gets a 400 that names it."""

from __future__ import annotations

import math
from typing import Any, TypeVar

import msgspec

from kiln_platform.errors import BadRequest

T = TypeVar("T")
DAY_S = 86_400


def convert(fields: dict[str, Any], into: type[T]) -> T:
    """``fields`` as ``into``, or ``BadRequest`` naming the field msgspec rejected."""
    try:
        return msgspec.convert(fields, into)
    except msgspec.ValidationError as exc:
        message = str(exc)  # "Expected `str` of length <= 100 - at `$.name`"
        _, at, path = message.rpartition("`$.")
        param = path.rstrip("`").split("[")[0] if at else None
        raise BadRequest(f"Invalid form: {message}", param=param) from None


def days(value: str, param: str, most: int = 3650) -> int | None:
    """A whole number of days, 1 to ``most``, as seconds (blank: None)."""
    if not value.strip():
        return None
    try:
        count = int(value)
    except ValueError:
        count = 0
    if not 1 <= count <= most:
        raise BadRequest(f"'{param}' must be a whole number of days from 1 to {most}.",
                         param=param)  # fmt: skip
    return count * DAY_S


def percent(value: str, param: str) -> int:
    """A whole percentage, 0 to 100 (blank: 0)."""
    text = value.strip() or "0"
    if not text.isdigit() or int(text) > 100:
        raise BadRequest(f"'{param}' must be a whole number from 0 to 100.", param=param)
    return int(text)


def fraction(value: str, param: str) -> float | None:
    """A percentage above 0 and below 100 (e.g. "99.9") as a fraction (blank: None)."""
    if not value.strip():
        return None
    share = number(value, param) / 100
    if not 0 < share < 1:
        raise BadRequest(f"'{param}' must be a percentage above 0 and below 100.", param=param)
    return share


def number(value: str, param: str) -> float:
    """A finite decimal number."""
    try:
        out = float(value)
    except ValueError:
        out = math.nan
    if not math.isfinite(out):
        raise BadRequest(f"'{param}' must be a number.", param=param)
    return out
