"""Structured outputs compiled to the grammar the worker follows (OpenAI's ``response_format``,
vLLM's ``structured_outputs`` and ``guided_*``), or a 400 naming the field."""

from __future__ import annotations

import json
from typing import Any

import llguidance
import msgspec
import pytest

from kiln_platform.errors import BadRequest
from kiln_platform.gateway._structured import compiled, grammar
from kiln_platform.gateway.llm_schemas import ChatCompletionRequest, CompletionRequest

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def _chat(**fields: Any) -> ChatCompletionRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    return msgspec.convert(body, ChatCompletionRequest)


def _only(compiled: str | None) -> dict[str, Any]:
    assert compiled is not None
    assert llguidance.LLMatcher.validate_grammar(compiled) == ""
    (only,) = json.loads(compiled)["grammars"]
    return dict(only)


def test_text_is_free_and_json_modes_compile_to_valid_grammars() -> None:
    assert grammar(_chat()) is None
    assert grammar(_chat(response_format={"type": "text"})) is None
    cases: list[tuple[dict[str, Any], Any]] = [
        ({"response_format": {"type": "json_object"}}, {"type": "object"}),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x",
                                                                     "schema": SCHEMA}}}, SCHEMA),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, {}),
        ({"structured_outputs": {"json": SCHEMA}}, SCHEMA),
        ({"structured_outputs": {"json_object": True}}, {"type": "object"}),
        ({"guided_json": json.dumps(SCHEMA)}, SCHEMA),
    ]  # fmt: skip
    for fields, wanted in cases:
        only = _only(grammar(_chat(**fields)))
        assert {k: v for k, v in only["json_schema"].items() if k != "x-guidance"} == wanted
        assert only["json_schema"]["x-guidance"]["whitespace_flexible"] is False


def test_regex_choice_and_lark_compile_for_text_completions_too() -> None:
    def text(**fields: Any) -> CompletionRequest:
        return msgspec.convert({"model": "m", "prompt": "x", **fields}, CompletionRequest)

    regex = _only(grammar(text(structured_outputs={"regex": "[0-9]{3}"})))
    assert regex["lark_grammar"] == "start: /[0-9]{3}/"
    cases: list[tuple[dict[str, Any], str]] = [
        ({"guided_choice": ['say "yes"', "no"]}, 'start: "say \\"yes\\"" | "no"'),
        ({"guided_grammar": 'start: "a"+'}, 'start: "a"+'),
    ]
    for fields, lark in cases:
        compiled = grammar(text(**fields))
        assert compiled == lark
        assert llguidance.LLMatcher.validate_grammar(compiled) == ""
    assert grammar(text(structured_outputs={"json_object": False})) is None


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"response_format": "json"}, "response_format"),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        ({"response_format": {"type": "json_schema", "json_schema": {"schema": [1]}}},
         "response_format.json_schema.schema"),
        ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "x"}}}},
         "response_format.json_schema.schema"),
        ({"structured_outputs": {"xml": "<a/>"}}, "structured_outputs.xml"),
        ({"structured_outputs": {"regex": "("}}, "structured_outputs.regex"),
        ({"structured_outputs": {"choice": []}}, "structured_outputs.choice"),
        ({"structured_outputs": {"grammar": "start: undefined_rule"}},
         "structured_outputs.grammar"),
        ({"guided_json": "{not json"}, "guided_json"),
        ({"guided_regex": ""}, "guided_regex"),
        ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "guided_regex"),
    ],
)  # fmt: skip
def test_what_cannot_run_is_a_400_naming_it(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(BadRequest) as refused:
        grammar(_chat(**fields))
    assert refused.value.param == param
    assert f"'{param}'" in refused.value.message


async def test_compiled_off_the_loop_only_when_a_constraint_is_set() -> None:
    assert await compiled(_chat(), None) is None
    fmt = {"type": "json_schema", "json_schema": {"schema": SCHEMA}}
    assert await compiled(_chat(response_format=fmt), None) == grammar(_chat(response_format=fmt))
    with pytest.raises(BadRequest):
        await compiled(_chat(guided_regex="("), None)
