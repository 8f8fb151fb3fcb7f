"""Structured outputs: a chat request's ``response_format`` as the grammar its sequences follow.

``json_object`` is any JSON object; ``json_schema`` is its ``schema`` (any JSON value if none).
Both compile to llguidance's grammar form here, where a schema it cannot run is a 400 naming
it, before anything is held or dispatched; the worker masks each step's logits with it. The
JSON has fixed separators (``", "``, ``": "``) and no other whitespace between tokens, so a
sampled answer cannot drift into blank lines.
"""

from __future__ import annotations

from typing import Any

import llguidance

from kiln_platform.errors import BadRequest

FORMATS = ("text", "json_object", "json_schema")


def _schema(response_format: dict[str, Any], param: str) -> Any:
    kind = response_format.get("type")
    if kind not in FORMATS:
        raise BadRequest(
            f"'{param}.type' is {kind!r}; Kiln supports {', '.join(FORMATS)}.",
            param=f"{param}.type",
        )
    if kind == "json_object":
        return {"type": "object"}
    spec = response_format.get("json_schema")
    if not isinstance(spec, dict):
        raise BadRequest(
            f"'{param}.json_schema' must be an object with a 'schema'.",
            param=f"{param}.json_schema",
        )
    schema = spec.get("schema", {})
    if not isinstance(schema, dict):
        raise BadRequest(
            f"'{param}.json_schema.schema' must be a JSON schema object.",
            param=f"{param}.json_schema.schema",
        )
    return schema


def grammar(response_format: Any, param: str = "response_format") -> str | None:
    """The llguidance grammar ``response_format`` asks for (``None``: free text)."""
    if response_format is None:
        return None
    if not isinstance(response_format, dict):
        raise BadRequest(f"'{param}' must be an object with a 'type'.", param=param)
    if response_format.get("type") == "text":
        return None
    schema = _schema(response_format, param)
    where = f"{param}.json_schema.schema" if response_format["type"] == "json_schema" else param
    try:
        compiled = llguidance.LLMatcher.grammar_from_json_schema(
            schema,
            overrides={"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "},
        )
    except ValueError as exc:
        raise BadRequest(f"'{where}' is not a usable JSON schema: {exc}", param=where) from None
    error = llguidance.LLMatcher.validate_grammar(compiled)
    if error:
        raise BadRequest(f"'{where}' is not a usable JSON schema: {error}", param=where)
    return compiled
