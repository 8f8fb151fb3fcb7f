"""Structured outputs: the grammar a completion's sequences follow, from OpenAI's
``response_format`` (chat) or vLLM's ``structured_outputs`` / ``guided_*`` (chat and text).

``json_object`` is any JSON object; a JSON schema (``response_format.json_schema.schema``,
``structured_outputs.json``) is its schema (any JSON value if none); ``regex`` a regular
expression, ``choice`` one of some strings, ``grammar`` a Lark grammar. Each compiles to
llguidance's grammar form here, where one it cannot run is a 400 naming the field, before
anything is held or dispatched; the worker masks each step's logits with it. JSON has fixed
separators (``", "``, ``": "``) and no other whitespace between tokens, so a sampled answer
cannot drift into blank lines.

A reasoning model's chat answer follows the grammar after its reasoning (``after_thought``), as
vLLM's structured outputs start at the reasoning's end: what it writes between ``<think>`` and
``</think>`` is free, then the answer is held to the grammar (unless the grammar writes the
tags itself).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Protocol

import anyio.to_thread
import llguidance

from kiln_platform.errors import BadRequest
from kiln_platform.gateway._reasoning import Split, Think

if TYPE_CHECKING:
    from collections.abc import Sequence

    from llguidance._lib import JsonCompileOptions

    from kiln_platform.gateway.llm_schemas import ChatCompletionRequest, CompletionRequest

FORMATS = ("text", "json_object", "json_schema")
KINDS = ("json", "regex", "choice", "grammar", "json_object")
JSON_STYLE: JsonCompileOptions = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
}
"""llguidance's JSON options: fixed separators, no free whitespace."""
_LEGACY = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice",
           "guided_grammar": "grammar"}  # fmt: skip


def _schema(schema: Any, where: str) -> dict[str, Any]:
    """A JSON schema given as an object or as its text."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError:
            raise BadRequest(f"'{where}' is not JSON.", param=where) from None
    if not isinstance(schema, dict):
        raise BadRequest(f"'{where}' must be a JSON schema object.", param=where)
    return schema


class Tools(Protocol):
    """What a tool plan (``_tools.ToolPlan``) gives the grammar."""

    @property
    def auto(self) -> bool: ...

    def constraint(self, answer: dict[str, Any] | None = None) -> tuple[str, Any]: ...


def _json(schema: Any, where: str) -> str:
    try:
        return llguidance.LLMatcher.grammar_from_json_schema(
            _schema(schema, where), overrides=JSON_STYLE
        )
    except ValueError as exc:
        raise BadRequest(f"'{where}' is not a usable JSON schema: {exc}", param=where) from None


def _compile(kind: str, value: Any, where: str) -> str:
    """The grammar of one constraint (``BadRequest`` naming ``where`` if it cannot be)."""
    if kind == "json":
        return _json(value, where)
    if kind == "json_object":
        return _json({"type": "object"}, where)
    if kind == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) for c in value):
            raise BadRequest(f"'{where}' must be a non-empty list of strings.", param=where)
        alternatives = " | ".join(json.dumps(choice) for choice in value)
        return llguidance.LLMatcher.grammar_from_lark(f"start: {alternatives}")
    if not isinstance(value, str) or not value:
        raise BadRequest(f"'{where}' must be a non-empty string.", param=where)
    if kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(value)
    return llguidance.LLMatcher.grammar_from_lark(value)


def _checked(grammar: str, where: str) -> str:
    error = llguidance.LLMatcher.validate_grammar(grammar)
    if error:
        raise BadRequest(f"'{where}' cannot be followed: {error}", param=where)
    return grammar


def _response_format(value: Any, param: str = "response_format") -> tuple[str, Any, str] | None:
    """OpenAI's ``response_format`` as (kind, value, field); ``None`` for free text."""
    if not isinstance(value, dict):
        raise BadRequest(f"'{param}' must be an object with a 'type'.", param=param)
    kind = value.get("type")
    if kind not in FORMATS:
        raise BadRequest(
            f"'{param}.type' is {kind!r}; Kiln supports {', '.join(FORMATS)}.",
            param=f"{param}.type",
        )
    if kind == "text":
        return None
    if kind == "json_object":
        return "json_object", True, param
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise BadRequest(
            f"'{param}.json_schema' must be an object with a 'schema'.",
            param=f"{param}.json_schema",
        )
    return "json", spec.get("schema", {}), f"{param}.json_schema.schema"


def _asked(request: ChatCompletionRequest | CompletionRequest) -> list[tuple[str, Any, str]]:
    """Every constraint the request sets, as (kind, value, field)."""
    asked = []
    response_format = getattr(request, "response_format", None)
    if response_format is not None and (found := _response_format(response_format)):
        asked.append(found)
    given = request.structured_outputs or {}
    unknown = sorted(set(given) - set(KINDS))
    if unknown:
        where = f"structured_outputs.{unknown[0]}"
        raise BadRequest(f"'{where}' is not one of {', '.join(KINDS)}.", param=where)
    asked += [(k, v, f"structured_outputs.{k}") for k, v in given.items() if v not in (None, False)]
    asked += [(kind, getattr(request, field), field) for field, kind in _LEGACY.items()
              if getattr(request, field) is not None]  # fmt: skip
    return asked


async def compiled(
    request: ChatCompletionRequest | CompletionRequest, tools: Tools | None
) -> str | None:
    """``grammar``, in a thread when the request sets a constraint: compiling and checking
    takes ~1 ms per KB of schema (50 ms for a 49 KB one, measured), and llguidance lets the
    event loop run meanwhile."""
    fields = ("response_format", "structured_outputs", *_LEGACY)
    if tools is None and all(getattr(request, name, None) is None for name in fields):
        return None
    return await anyio.to_thread.run_sync(grammar, request, tools)


def _with_tools(asked: list[tuple[str, Any, str]], tools: Tools) -> list[tuple[str, Any, str]]:
    """The constraints with the tool plan's: one more, but with ``auto`` tools a JSON answer
    (mode or schema, checked alone first) is the answer the model may give instead of calls
    (OpenAI takes both together)."""
    if tools.auto and len(asked) == 1 and asked[0][0] in ("json", "json_object"):
        kind, value, where = asked[0]
        answer = _schema({"type": "object"} if kind == "json_object" else value, where)
        _checked(_json(answer, where), where)
        return [(*tools.constraint(answer), "tools")]
    return [*asked, (*tools.constraint(), "tools")]


def grammar(
    request: ChatCompletionRequest | CompletionRequest, tools: Tools | None = None
) -> str | None:
    """The llguidance grammar the request asks its text to follow (``None``: free text); a
    tool plan's calls are one more constraint."""
    asked = _asked(request)
    if tools is not None:
        asked = _with_tools(asked, tools)
    if len(asked) > 1:
        fields = ", ".join(f"'{where}'" for _, _, where in asked)
        raise BadRequest(f"Set one structured output, not {fields}.", param=asked[1][2])
    if not asked:
        return None
    kind, value, where = asked[0]
    return _checked(_compile(kind, value, where), where)


THOUGHT = """thought[stop="{close}"]: /(.|\\n)*/
GAP: /[ \\t\\r\\n]{{0,4}}/
"""
"""The reasoning (free text, ended by its closing tag, ``</think>``) and a little blank space
after it (with no bound a sampled answer can drift into blank space to its token limit, seen
with random weights)."""


def after_thought(
    grammar: str | None, think: Think | None, prompt: Sequence[int],
    harmony: tuple[int, int, int, int] | None = None,
) -> str | None:  # fmt: skip
    """``grammar`` after a reasoning model's reasoning (``think``: its tags' ids; ``None``, or
    no grammar: as it is): inside it first if ``prompt`` left a ``<think>`` open, else the
    model may open one before the answer. A grammar that writes the tags itself (a regex or
    Lark grammar shaping the reasoning too) is the whole answer's, as it is. gpt-oss's
    (``harmony``: its markers' ids) is its final channel's, unless the prompt opened it."""
    if grammar is not None and harmony is not None:  # unless it writes the messages itself
        opened = bool(prompt) and prompt[-1] == harmony[2]
        return grammar if opened or f"<[{harmony[1]}]>" in grammar else after_analysis(
            grammar, harmony)  # fmt: skip
    if grammar is None or think is None or "think>" in grammar:  # `<\/think>` in a regex too
        return grammar
    inside = Split.after(think, prompt).state == "inside"
    start = "thought GAP" if inside else f'("{think.open}" thought GAP)?'
    lead = f"start: {start} @answer\n{THOUGHT.format(close=think.close)}"
    return behind(grammar, "thinking", lead)


def after_analysis(grammar: str, ids: tuple[int, int, int, int]) -> str:
    """``grammar`` for gpt-oss's final channel's message, after an analysis one the model may
    write first: vLLM's structured outputs after gpt-oss's reasoning."""
    start, channel, message, end = ids
    lead = f"""start: analysis? <[{channel}]> "final" <[{message}]> @answer
analysis: <[{channel}]> "analysis" <[{message}]> THOUGHT <[{end}]> <[{start}]> "assistant"
THOUGHT: /(.|\\n)*/
"""
    return behind(grammar, "harmony", lead)


def behind(grammar: str, name: str, lead: str) -> str:
    """``grammar`` (Lark, or llguidance's JSON form) after ``lead``, a Lark grammar that
    names it ``@answer`` (its first grammar; any others kept), in llguidance's JSON form."""
    spec = json.loads(grammar) if grammar.lstrip().startswith("{") else None
    parts = spec["grammars"] if spec is not None else [{"lark_grammar": grammar}]
    grammars = [{"name": name, "lark_grammar": lead}, {**parts[0], "name": "answer"}, *parts[1:]]
    return json.dumps({**(spec or {}), "grammars": grammars})
