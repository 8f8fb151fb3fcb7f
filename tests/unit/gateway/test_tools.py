"""Tool calls: the plan a request's ``tools`` and ``tool_choice`` make, the schema or grammar its
answer is held to, the answer read back as calls, and calls sent back as history."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import llguidance
import msgspec
import pytest
from tokenizers import Tokenizer

from kiln_platform.errors import BadRequest
from kiln_platform.gateway._prompts import _briefed, _turn
from kiln_platform.gateway._structured import grammar
from kiln_platform.gateway._tools import brief, closed, plan
from kiln_platform.gateway.llm_schemas import ChatCompletionRequest, Message
from tests.factories import accepts, byte_bpe

ARGS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
CLOSED = ARGS | {"additionalProperties": False}  # the arguments a call may have: these only
TOOLS = [{"type": "function", "function": {"name": "weather", "parameters": ARGS}},
         {"type": "function", "function": {"name": "time"}}]  # fmt: skip


def test_required_is_a_list_of_named_calls_each_with_its_own_schema() -> None:
    made = plan(TOOLS, "required", None)
    assert made is not None
    assert (made.named, made.finish_reason) == (None, "tool_calls")
    schema = made.schema()
    assert "maxItems" not in schema
    names = [c["properties"]["name"]["const"] for c in schema["items"]["anyOf"]]
    params = [c["properties"]["parameters"] for c in schema["items"]["anyOf"]]
    no_arguments = {"type": "object", "properties": {}, "additionalProperties": False}
    assert (names, params) == (["weather", "time"], [CLOSED, no_arguments])
    nulled = plan([{"type": "function", "function": {"name": "time", "parameters": None}}],
                  "required", None)  # fmt: skip
    assert nulled is not None
    assert nulled.functions == {"time": no_arguments}
    assert plan(TOOLS, "required", False).schema()["maxItems"] == 1  # type: ignore[union-attr]
    grammar = llguidance.LLMatcher.grammar_from_json_schema(schema)
    assert llguidance.LLMatcher.validate_grammar(grammar) == ""
    text = json.dumps([{"name": "weather", "parameters": {"city": "Oslo"}},
                       {"name": "time", "parameters": {}}])  # fmt: skip
    calls = made.calls(text, "call-1")
    assert [(c.id, c.function.name, json.loads(c.function.arguments)) for c in calls or []] == [
        ("call-1_0", "weather", {"city": "Oslo"}), ("call-1_1", "time", {})
    ]  # fmt: skip
    assert made.calls('[{"name": "weather", "param', "call-1") is None


def test_a_named_function_writes_its_arguments_alone() -> None:
    made = plan(TOOLS, {"type": "function", "function": {"name": "weather"}}, True)
    assert made is not None
    assert (made.schema(), made.finish_reason) == (CLOSED, "stop")
    (call,) = made.calls('{"city": "Rome"}', "c") or []
    assert (call.function.name, call.function.arguments) == ("weather", '{"city": "Rome"}')


@pytest.mark.parametrize(
    ("schema", "want"),
    [
        ({"type": "object", "properties": {"a": {"type": "object", "properties": {}}}},
         {"type": "object", "properties": {"a": {"type": "object", "properties": {},
          "additionalProperties": False}}, "additionalProperties": False}),
        ({"properties": {"a": {}}, "additionalProperties": True},
         {"properties": {"a": {}}, "additionalProperties": True}),  # said: kept
        ({"type": "object"}, {"type": "object"}),  # no properties listed: any object
        ({"properties": {"a": {}}, "allOf": [{"properties": {"b": {}}}]},
         {"properties": {"a": {}}, "allOf": [{"properties": {"b": {}}}]}),  # composed: as written
        ({"anyOf": [{"properties": {"a": {}}}, {"type": "string"}]},
         {"anyOf": [{"properties": {"a": {}}, "additionalProperties": False}, {"type": "string"}]}),
        ({"type": "array", "items": {"properties": {"a": {}}}},
         {"type": "array", "items": {"properties": {"a": {}}, "additionalProperties": False}}),
        ({"$defs": {"P": {"properties": {"x": {}}}}, "properties": {"p": {"$ref": "#/$defs/P"}}},
         {"$defs": {"P": {"properties": {"x": {}}, "additionalProperties": False}},
          "properties": {"p": {"$ref": "#/$defs/P"}}, "additionalProperties": False}),
    ],
)  # fmt: skip
def test_objects_are_closed_unless_said_or_composed(
    schema: dict[str, Any], want: dict[str, Any]
) -> None:
    assert closed(schema) == want


def test_none_or_no_tools_is_text() -> None:
    assert plan(None, None, None) is None
    assert plan([], "none", None) is None
    assert plan(TOOLS, "none", None) is None


@pytest.mark.parametrize(
    ("tools", "choice", "param", "words"),
    [
        (TOOLS, "sometimes", "tool_choice", "'auto'"),
        (None, "required", "tool_choice", "needs 'tools'"),
        (TOOLS, {"type": "function", "function": {"name": "nope"}}, "tool_choice", "one of"),
        ([{"type": "function"}], "required", "tools[0]", "'function'"),
        ([{"type": "retrieval", "function": {"name": "a"}}], "required", "tools[0]", "'type'"),
        ([TOOLS[0], TOOLS[0]], "required", "tools[1].function.name", "unique"),
        ([{"type": "function", "function": {"name": "a", "parameters": []}}], "required",
         "tools[0].function.parameters", "JSON schema"),
    ],
)  # fmt: skip
def test_what_cannot_be_called_is_a_400_naming_it(
    tools: Any, choice: Any, param: str, words: str
) -> None:
    with pytest.raises(BadRequest) as refused:
        plan(tools, choice, None)
    assert refused.value.param == param
    assert words in refused.value.message


def test_calls_go_back_as_the_template_can_show_them() -> None:
    said = Message(role="assistant", content=None, tool_calls=[
        {"id": "c", "type": "function",
         "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}}
    ])  # fmt: skip
    aware: Any = SimpleNamespace(tool_aware=True, nine_ids=False)
    plain: Any = SimpleNamespace(tool_aware=False, nine_ids=False)
    assert _turn(0, said, aware) == {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "id": "c",
         "function": {"name": "weather", "arguments": {"city": "Oslo"}}}
    ]}  # fmt: skip
    shown = _turn(0, said, plain)["content"]
    assert shown == '<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    assert plan(TOOLS, "auto", None).calls(shown, "c") is not None  # type: ignore[union-attr]
    answer = Message(role="tool", content="12 C", tool_call_id="c")
    assert _turn(1, answer, plain) == {"role": "tool", "content": "12 C", "tool_call_id": "c"}
    broken = Message(role="assistant", tool_calls=[{"function": {"name": "w", "arguments": "{"}}])
    with pytest.raises(BadRequest) as refused:
        _turn(2, broken, plain)
    assert refused.value.param == "messages[2].tool_calls[0].function"


WEATHER_CALL = '<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
TIME_CALL = '<tool_call>\n{"name": "time", "arguments": {}}\n</tool_call>'


@pytest.fixture(scope="module")
def matcher_tokenizer() -> Tokenizer:
    """A byte-level BPE trained here (any byte string can be written in its tokens)."""
    return byte_bpe([WEATHER_CALL, TIME_CALL, "It is sunny in Oslo."] * 20)


@pytest.mark.parametrize(
    ("text", "parallel", "follows"),
    [
        ("It is sunny in Oslo.", True, True),
        ("\nSunny <b>today</b>", True, True),
        (WEATHER_CALL, True, True),
        (f"{WEATHER_CALL}\n{TIME_CALL}", True, True),
        (f"{WEATHER_CALL}\n{TIME_CALL}", False, False),
        (f"\n\n{WEATHER_CALL}\n\n{TIME_CALL}", True, True),  # blank space before each call
        ("\n\n<tool_call>\nSunny", True, False),  # a call, not text, past the blank space
        ("<b>Sunny</b> in Oslo", True, True),
        ("<tool_callback>", True, True),
        (f"Sure.\n\n{WEATHER_CALL}", True, True),  # words, then calls
        (f"Sure.<tool_call>{WEATHER_CALL}", True, False),  # an opening is a call's
        (f"{WEATHER_CALL} Done.", True, False),  # no words after them
        ("<tool_call>\nSunny", True, False),
        ('<tool_call>\n{"name": "weather", "arguments": {}}\n</tool_call>', True, False),
        ('<tool_call>\n{"name": "nope", "arguments": {}}\n</tool_call>', True, False),
        # only the arguments a function declares, none for one that declares none
        (
            '<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo", "rate": "x"}}\n'
            "</tool_call>",
            True,
            False,
        ),
        ('<tool_call>\n{"name": "time", "arguments": {"city": "Oslo"}}\n</tool_call>', True, False),
        ('<tool_call>\n{"name":"time","arguments":{}}\n</tool_call>', True, False),
    ],
)
def test_auto_is_text_or_hermes_calls_each_held_to_its_schema(
    matcher_tokenizer: Any, text: str, parallel: bool, follows: bool
) -> None:
    made = plan(TOOLS, None if parallel else "auto", None if parallel else False)
    assert made is not None
    assert (made.auto, made.parallel, made.finish_reason) == (True, parallel, "tool_calls")
    kind, lark = made.constraint()
    grammar = llguidance.LLMatcher.grammar_from_lark(lark)
    assert (kind, llguidance.LLMatcher.validate_grammar(grammar)) == ("grammar", "")
    assert accepts(matcher_tokenizer, grammar, text) is follows


def test_auto_reads_calls_back_and_text_as_text() -> None:
    made = plan(TOOLS, "auto", None)
    assert made is not None
    calls = made.calls(f"{WEATHER_CALL}\n{TIME_CALL}", "call-1")
    assert [(c.id, c.function.name, json.loads(c.function.arguments)) for c in calls or []] == [
        ("call-1_0", "weather", {"city": "Oslo"}), ("call-1_1", "time", {})
    ]  # fmt: skip
    assert made.calls(f"\n\n{TIME_CALL}", "c") == made.calls(TIME_CALL, "c")
    assert made.calls("It is sunny.", "c") is None
    assert made.calls("<b>Sunny</b>", "c") is None
    assert made.calls(WEATHER_CALL[:30], "c") is None  # cut by max_tokens: its text


@pytest.mark.parametrize(
    ("held", "sent", "sendable"),
    [("", False, 0), ("<", False, 0), ("<tool_ca", False, 0), ("<tool_call>\n{", False, 0),
     ("Sun", False, 3), ("<b", False, 2), ("<tool_cab", False, 9), ("\n\n", False, 0),
     (" <tool_call>", False, 0), ("\n\nSun", False, 5), ("Sure <tool_c", True, 4),
     ("Sure.\n\n<tool_call>\n{", True, 5), ("ny. ", True, 3), ("ny <b>", True, 6)],
)  # fmt: skip
def test_auto_streams_words_while_they_cannot_be_a_call(
    held: str, sent: bool, sendable: int
) -> None:
    """A stream holds an answer's words only while they may still open a call (and the blank
    space before it): the words before a call are sent as they come."""
    made = plan(TOOLS, "auto", None)
    assert made is not None
    assert made.sendable(held, sent) == sendable
    assert made.preface("Sure.\n\n<tool_call>\n{}") == "Sure."


def test_auto_shows_the_tools_to_a_template_that_does_not() -> None:
    text = brief(TOOLS)
    assert "<tools>" in text
    assert json.dumps(TOOLS[0]) in text
    assert '{"name": <function-name>, "arguments": <args-json-object>}' in text
    user = {"role": "user", "content": "Weather?"}
    assert _briefed([user], text) == [{"role": "system", "content": text}, user]
    system = {"role": "system", "content": "Be brief."}
    assert _briefed([system, user], text) == [
        {"role": "system", "content": f"Be brief.\n\n{text}"}, user
    ]  # fmt: skip


def _chat(**fields: Any) -> ChatCompletionRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    return msgspec.convert(body, ChatCompletionRequest)


ANSWER = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
          "additionalProperties": False}  # fmt: skip


@pytest.mark.parametrize(
    ("text", "follows"),
    [('{"a": 1}', True), (WEATHER_CALL, True), ("It is sunny.", False), ('{"b": 1}', False),
     ('\n{"a": 1}', True), (f"\n{WEATHER_CALL}", True), ('\n\n\n\n\n{"a": 1}', False)],
)  # fmt: skip
def test_auto_with_a_json_schema_answers_that_json_or_calls(
    matcher_tokenizer: Any, text: str, follows: bool
) -> None:
    """OpenAI takes ``response_format`` with ``tools``: the answer is the schema's JSON or
    calls."""
    made = plan(TOOLS, "auto", None)
    fmt = {"type": "json_schema", "json_schema": {"schema": ANSWER}}
    compiled = grammar(_chat(response_format=fmt), made)
    assert compiled is not None
    assert accepts(matcher_tokenizer, compiled, text) is follows


@pytest.mark.parametrize(
    ("choice", "fields", "param"),
    [
        ("required", {"response_format": {"type": "json_object"}}, "tools"),
        ("auto", {"guided_regex": "a+"}, "tools"),
        ("auto", {"response_format": {"type": "json_schema", "json_schema": {"schema": {
            "type": "x"}}}}, "response_format.json_schema.schema"),
    ],
)  # fmt: skip
def test_tools_and_another_constraint_are_a_400_naming_one(
    choice: str, fields: dict[str, Any], param: str
) -> None:
    with pytest.raises(BadRequest) as refused:
        grammar(_chat(**fields), plan(TOOLS, choice, None))
    assert refused.value.param == param
