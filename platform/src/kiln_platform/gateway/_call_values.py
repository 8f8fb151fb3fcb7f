"""How a tag-shaped call (``_tagged_calls``) writes a parameter's value: as raw text, as its
family's templates write a string, or as JSON, which the grammar can hold to its schema."""

from __future__ import annotations

from typing import Any

_ANNOTATIONS = frozenset({"type", "description", "title", "default", "examples", "deprecated",
                          "readOnly", "writeOnly", "$comment"})  # fmt: skip


def raw(schema: Any) -> bool:
    """Whether a parameter is written as raw text: a plain string (or one its schema does not
    describe, as an open object's), or one of a few strings; a string with a pattern or bounds,
    and anything else, is JSON, so the grammar can hold it."""
    if not isinstance(schema, dict):
        return True
    return choices(schema) is not None or (
        schema.get("type") == "string" and _ANNOTATIONS.issuperset(schema)
    )


def choices(schema: dict[str, Any]) -> list[str] | None:
    """The strings a parameter may be (its ``enum`` or ``const``), if that is all it says."""
    given = schema.get("enum", [schema["const"]] if "const" in schema else None)
    plain = _ANNOTATIONS.issuperset(schema.keys() - {"enum", "const"})
    strings = isinstance(given, list) and given and all(isinstance(g, str) for g in given)
    return given if strings and plain and schema.get("type", "string") == "string" else None
