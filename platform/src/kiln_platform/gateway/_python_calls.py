"""LFM2's calls (vLLM's ``lfm2`` parser): words, then its ``<|tool_call_start|>`` token, a
Python list of calls, ``[get_weather(city='Oslo', days=3)]``, and its ``<|tool_call_end|>``.

The tokens are special, so a chat's text keeps them (``marked``). Values as its template writes
them: a plain string single-quoted as it is, booleans as Python's, anything else JSON held to
its schema (a list it writes as Python). Parameters in schema order, the required ones required.
"""

from __future__ import annotations

import json
from typing import Any

from kiln_platform.gateway._call_formats import Bracketed, held
from kiln_platform.gateway._call_values import choices, raw

_CONSTANTS = {"True": True, "False": False, "None": None}
_ANY = '(QUOTED | "True" | "False" | "None" | %json {})'
"""A value a parameter no schema describes may take."""


class Pythonic(Bracketed):
    """The format, bound to the ids of the tokens around the calls."""

    open, close = "<|tool_call_start|>", "<|tool_call_end|>"

    def between(self, functions: dict[str, dict[str, Any]], parallel: bool) -> list[str]:
        listed = '"[" call (", " call)* "]"' if parallel else '"[" call "]"'
        alternatives = " | ".join(f"f{i}" for i in range(len(functions)))
        lines = [listed, f"call: {alternatives}", "QUOTED: /'[^']*'/"]
        for i, (name, params) in enumerate(functions.items()):
            lines.extend(_function(f"f{i}", name, params))
        return lines

    def read(self, text: str, functions: dict[str, dict[str, Any]]) -> list[tuple[str, Any]]:
        del functions
        at, calls = text.index(self.open) + len(self.open) + 1, []  # past its "["
        while text[at] != "]":
            paren = text.index("(", at)
            name, arguments, at = text[at:paren], {}, paren + 1
            while text[at] != ")":
                equals = text.index("=", at)
                arguments[text[at:equals]], at = _value(text, equals + 1)
                at += 2 if text.startswith(", ", at) else 0
            calls.append((name, arguments))
            at += 3 if text.startswith(", ", at + 1) else 1  # past ")" and any ", "
        return calls


def _value(text: str, at: int) -> tuple[Any, int]:
    """The value at ``at`` in a call's text, and where it ends."""
    if text[at] == "'":
        end = text.index("'", at + 1)
        return text[at + 1 : end], end + 1
    constant = next((c for c in _CONSTANTS if text.startswith(c, at)), None)
    if constant is not None:
        return _CONSTANTS[constant], at + len(constant)
    return json.JSONDecoder().raw_decode(text, at)


def _function(rule: str, name: str, params: dict[str, Any]) -> list[str]:
    """Lark for one function's call: ``key=value`` parts parted by ``, ``, in the schema's
    order, each optional one there or not (``_h`` rules: none written yet; ``_t``: some)."""
    properties = params.get("properties")
    if not isinstance(properties, dict):  # any keyword arguments
        any_part = f'/[A-Za-z_][A-Za-z0-9_]*/ "=" {_ANY}'
        return [f'{rule}: {json.dumps(name + "(")} ({any_part} (", " {any_part})*)? ")"']
    required = set(params.get("required", []))
    defs: dict[str, Any] = {k: params[k] for k in ("$defs", "definitions") if k in params}
    keys = list(properties)
    lines = [f'{rule}: {json.dumps(name + "(")} {f"{rule}_h0" if keys else ""} ")"']
    for j, key in enumerate(keys):
        part = f"{json.dumps(key + '=')} {_typed(properties[key], defs)}"
        head, tail = (f"{rule}_h{j + 1}", f"{rule}_t{j + 1}") if j + 1 < len(keys) else ("", "")
        if key in required:
            lines += [f"{rule}_h{j}: {part} {tail}", f'{rule}_t{j}: ", " {part} {tail}']
        else:
            first = f"({part} {tail} | {head})" if head else f"({part})?"
            lines += [f"{rule}_h{j}: {first}", f'{rule}_t{j}: (", " {part})? {tail}']
    return [line for line in lines if not line.startswith(f"{rule}_t0:")]


def _typed(schema: Any, defs: dict[str, Any]) -> str:
    """Lark for one parameter's value, as LFM2's template writes it."""
    if not isinstance(schema, dict):
        return _ANY
    given = choices(schema)
    if given and not any("'" in c for c in given):
        return "(" + " | ".join(json.dumps(f"'{c}'") for c in given) + ")"
    if raw(schema) and not given:
        return "QUOTED"
    if schema.get("type") == "boolean" and not {"enum", "const"} & set(schema):
        return '("True" | "False")'
    return f"%json {held(schema | defs)}"
