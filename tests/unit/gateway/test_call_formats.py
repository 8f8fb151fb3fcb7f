"""Tool calls in the format a model's chat template teaches (``tool_choice: "auto"``): which
format a template teaches, the grammar each holds an answer to, and calls read back."""

from __future__ import annotations

import json
from typing import Any

import jinja2
import llguidance
import pytest
from tokenizers import Tokenizer

from kiln_platform.gateway._call_formats import HERMES, JSON, XML, CallFormat, raw, taught
from kiln_platform.gateway._tools import ToolPlan, plan
from tests.factories import accepts, byte_bpe

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "description": "A city"}, "days": {"type": "integer"},
    "unit": {"enum": ["C", "F"]}, "where": {"type": "object", "properties": {
        "lat": {"type": "number"}}, "required": ["lat"]}},
    "required": ["city"]}  # fmt: skip
TOOLS = [{"type": "function", "function": {"name": "weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "time"}}]  # fmt: skip
XML_CALL = (
    "<tool_call>\n<function=weather>\n<parameter=city>\nSt. Louis, <b>MO</b>\nUSA\n</parameter>"
    '\n<parameter=days>\n3\n</parameter>\n<parameter=unit>\n"F"\n</parameter>\n'
    '<parameter=where>\n{"lat": 38.6}\n</parameter>\n</function>\n</tool_call>'
)
XML_TIME = "<tool_call>\n<function=time>\n</function>\n</tool_call>"
JSON_CALL = '{"name": "weather", "parameters": {"city": "Oslo", "days": 2}}'
JSON_TIME = '{"name": "time", "parameters": {}}'
QWEN35_CALLS = """{%- for call in calls %}{{- '\\n<tool_call>\\n<function=' + call.name + '>\\n' }}
{%- for key, value in call.arguments|items %}{{- '<parameter=' + key + '>\\n' }}
{%- set value = value | tojson if value is mapping or (value is sequence and value is not string)
 else value | string %}{{- value }}{{- '\\n</parameter>\\n' }}{% endfor %}
{{- '</function>\\n</tool_call>' }}{% endfor %}"""
"""How Qwen 3.5's template writes an assistant's calls in a chat's history (its words)."""


def _plan(call_format: CallFormat, parallel: bool = True) -> ToolPlan:
    made = plan(TOOLS, "auto", parallel)
    assert made is not None
    return made.written(call_format)


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return byte_bpe([XML_CALL, XML_TIME, JSON_CALL, JSON_TIME, "It is sunny in Oslo."] * 20)


def _follows(
    tok: Tokenizer, made: ToolPlan, text: str, answer: dict[str, Any] | None = None
) -> bool:
    kind, lark = made.constraint(answer)
    grammar = llguidance.LLMatcher.grammar_from_lark(lark)
    assert (kind, llguidance.LLMatcher.validate_grammar(grammar)) == ("grammar", "")
    return accepts(tok, grammar, text)


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("{{ tools }} <tool_call>\n<function=f>\n<parameter=p>\nv\n</parameter>", XML),
        ('{{ tools }} Respond in the format {"name": function name, "parameters": dictionary '
         "of argument name and its value}.", JSON),
        ("{{ tools }} <tool_call>\n{\"name\": <function-name>, \"arguments\": {}}", HERMES),
        ("{{ messages }}", HERMES),
    ],
)  # fmt: skip
def test_a_template_teaches_its_format(template: str, expected: CallFormat) -> None:
    assert taught(template) is expected


@pytest.mark.parametrize(
    ("text", "parallel", "follows"),
    [
        ("It is sunny in Oslo.", True, True),
        ("<b>Sunny</b>", True, True),
        (XML_CALL, True, True),
        (f"{XML_CALL}\n{XML_TIME}", True, True),
        (f"{XML_CALL}\n{XML_TIME}", False, False),
        (f"\n\n{XML_TIME}", True, True),
        ("<tool_call>\n<function=weather>\n<parameter=city>\nOslo\n</parameter>\n</function>\n"
         "</tool_call>", True, True),  # optional parameters left out
        ("<tool_call>\n<function=weather>\n<parameter=days>\n3\n</parameter>\n</function>\n"
         "</tool_call>", True, False),  # the required city missing
        ("<tool_call>\n<function=weather>\n<parameter=city>\nOslo\n</parameter>\n"
         "<parameter=days>\nthree\n</parameter>\n</function>\n</tool_call>", True, False),
        ("<tool_call>\n<function=weather>\n<parameter=city>\nOslo\n</parameter>\n"
         "<parameter=unit>\nK\n</parameter>\n</function>\n</tool_call>", True, False),
        ("<tool_call>\n<function=nope>\n</function>\n</tool_call>", True, False),
        ("<tool_call>\n{\"name\": \"time\", \"arguments\": {}}\n</tool_call>", True, False),
    ],
)  # fmt: skip
def test_xml_calls_hold_each_parameter_to_its_schema(
    tokenizer: Any, text: str, parallel: bool, follows: bool
) -> None:
    """Qwen3-Coder's and Qwen 3.5's format: a plain string raw (any text, newlines and tags
    too, up to its closing tag), anything else JSON held to its schema."""
    assert _follows(tokenizer, _plan(XML, parallel), text) is follows


def test_xml_calls_read_back_typed_as_their_schema_says() -> None:
    made = _plan(XML)
    calls = made.calls(f"{XML_CALL}\n{XML_TIME}", "c")
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls or []] == [
        ("weather", {"city": "St. Louis, <b>MO</b>\nUSA", "days": 3, "unit": "F",
                     "where": {"lat": 38.6}}),
        ("time", {}),
    ]  # fmt: skip
    assert made.calls("It is sunny.", "c") is None
    assert made.calls(XML_CALL[:40], "c") is None  # cut by max_tokens: its text
    assert (raw({"type": "string"}), raw({"type": "string", "maxLength": 3})) == (True, False)


def test_a_call_written_as_qwen35s_template_writes_it_is_what_the_grammar_takes(
    tokenizer: Any,
) -> None:
    """The calls a chat's history shows the model are the calls it may write, and read back to
    the same arguments."""
    arguments = {"city": "Oslo", "days": 3, "where": {"lat": 59.9}}
    env = jinja2.Environment(autoescape=False)  # noqa: S701 (a prompt, not HTML)
    written = env.from_string(QWEN35_CALLS).render(
        calls=[{"name": "weather", "arguments": arguments}, {"name": "time", "arguments": {}}]
    )
    made = _plan(XML)
    assert _follows(tokenizer, made, written)
    calls = made.calls(written, "c") or []
    assert [json.loads(c.function.arguments) for c in calls] == [arguments, {}]


@pytest.mark.parametrize(
    ("text", "parallel", "follows"),
    [
        ("It is sunny in Oslo.", True, True),
        ('{"a": 1}', True, True),  # JSON that is no call is text
        (JSON_CALL, True, True),
        (f"\n{JSON_CALL}", True, True),
        (f"{JSON_CALL}; {JSON_TIME}", True, True),
        (f"{JSON_CALL}; {JSON_TIME}", False, False),
        ('{"name": "nope", "parameters": {}}', True, False),
        ('{"name": "time", "parameters": {"city": "Oslo"}}', True, False),
        ('{"name": "weather", "parameters": {"days": 2}}', True, False),
    ],
)
def test_json_calls_are_llama_3s(tokenizer: Any, text: str, parallel: bool, follows: bool) -> None:
    """Llama 3.1-3.3's format: the call's JSON alone, ``parameters`` its arguments."""
    assert _follows(tokenizer, _plan(JSON, parallel), text) is follows


def test_json_calls_read_back_and_beside_a_json_answer(tokenizer: Any) -> None:
    made = _plan(JSON)
    calls = made.calls(f"{JSON_CALL}; {JSON_TIME}", "c")
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls or []] == [
        ("weather", {"city": "Oslo", "days": 2}), ("time", {})
    ]  # fmt: skip
    assert made.calls('{"a": 1}', "c") is None
    assert made.calls('{"name": "Ada"}', "c") is None  # an answer that starts as a call would
    assert (made.is_text('{"na'), made.is_text('{"a'), made.is_text("Sun")) == (False, True, True)
    answer = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    assert _follows(tokenizer, made, '{"a": 1}', answer)
    assert _follows(tokenizer, made, JSON_CALL, answer)
    assert not _follows(tokenizer, made, "It is sunny.", answer)
