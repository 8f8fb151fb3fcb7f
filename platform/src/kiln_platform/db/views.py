"""Rows as wire views: a msgspec struct filled from an ORM row's same-named attributes."""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

ViewT = TypeVar("ViewT", bound=msgspec.Struct)


def view_of(view: type[ViewT], row: object, **overrides: Any) -> ViewT:
    """``view`` with each field read from ``row``'s attribute of that name, unless overridden
    (a field whose value is computed, or renamed, or converted)."""
    names = (f.name for f in msgspec.structs.fields(view) if f.name not in overrides)
    return view(**{name: getattr(row, name) for name in names}, **overrides)
