"""Tool calls in the format a model's chat template teaches (``tool_choice: "auto"``): which
format a template teaches, the grammar each holds an answer to, and calls read back."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jinja2
import llguidance
import msgspec
import pytest
from tokenizers import AddedToken, Tokenizer

from kiln_platform.gateway._call_formats import (
    HERMES,
    JSON,
    XML,
    CallFormat,
    Mistral,
    MistralArgs,
    raw,
    taught,
)
from kiln_platform.gateway._prompts import chat_prompt
from kiln_platform.gateway._textmodel import load_text_model
from kiln_platform.gateway._tools import ToolPlan, plan
from kiln_platform.gateway.llm_schemas import ChatCompletionRequest
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
    "\n<parameter=days>\n3\n</parameter>\n<parameter=unit>\nF\n</parameter>\n"
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
    """A byte-level BPE with Mistral's ``[TOOL_CALLS]``, a special token."""
    tok = byte_bpe([XML_CALL, XML_TIME, JSON_CALL, JSON_TIME, "It is sunny in Oslo."] * 20)
    tok.add_tokens([AddedToken(t, special=True, normalized=False)
                    for t in ("[TOOL_CALLS]", "[ARGS]")])  # fmt: skip
    return tok


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
    assert taught(template, byte_bpe(["x"])) is expected


def test_mistrals_template_teaches_its_token_and_a_json_list(tokenizer: Tokenizer) -> None:
    """Mistral's ``[TOOL_CALLS]`` is taught only by a tokenizer that has the token, and not in
    its newer ``name[ARGS]{...}`` form (left to Hermes' format)."""
    said = "{{ tools }}{{- '[TOOL_CALLS] [' }}"
    made = taught(said, tokenizer)
    assert isinstance(made, Mistral)
    assert made.token_id == tokenizer.token_to_id("[TOOL_CALLS]")
    assert taught(said, byte_bpe(["x"])) is HERMES
    newer = taught(said + "{{- name + '[ARGS]' + arguments }}", tokenizer)
    assert isinstance(newer, MistralArgs)
    assert (newer.calls_id, newer.args_id) == (made.token_id, tokenizer.token_to_id("[ARGS]"))


@pytest.mark.parametrize(
    ("text", "parallel", "follows"),
    [
        ("It is sunny in Oslo.", True, True),
        ("<b>Sunny</b>", True, True),
        (XML_CALL, True, True),
        (f"{XML_CALL}\n{XML_TIME}", True, True),
        (f"{XML_CALL}\n{XML_TIME}", False, False),
        (f"\n\n{XML_TIME}", True, True),
        (f"Let me look.\n\n{XML_TIME}", True, True),  # words, then calls
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
    assert made.preface(f"Let me look.\n\n{XML_TIME}") == "Let me look."
    assert made.calls(f"Let me look.\n\n{XML_TIME}", "c") == made.calls(XML_TIME, "c")
    kinds = [{"type": "string"}, {"enum": ["C", "F"]}, {"type": "string", "maxLength": 3},
             {"enum": ["C", 1]}, {"type": "integer"}]  # fmt: skip
    assert [raw(kind) for kind in kinds] == [True, True, False, False, False]


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
    assert [made.sendable(said, False) for said in ('{"na', '{"a', "Sun")] == [0, 3, 3]
    assert made.sendable('{"na', True) == 4  # past the first words, nothing opens a call
    answer = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    assert _follows(tokenizer, made, '{"a": 1}', answer)
    assert _follows(tokenizer, made, JSON_CALL, answer)
    assert not _follows(tokenizer, made, "It is sunny.", answer)


MISTRAL_CALL = '[TOOL_CALLS] [{"name": "weather", "arguments": {"city": "Oslo"}}]'
MISTRAL_TIME = '{"name": "time", "arguments": {}}'


def _marker(tokenizer: Tokenizer) -> int:
    found = tokenizer.token_to_id("[TOOL_CALLS]")
    assert found is not None
    return found


@pytest.mark.parametrize(
    ("text", "parallel", "follows"),
    [
        ("It is sunny in Oslo.", True, True),
        (MISTRAL_CALL, True, True),
        (f"[TOOL_CALLS] [{MISTRAL_TIME}, {MISTRAL_TIME}]", True, True),
        (f"[TOOL_CALLS] [{MISTRAL_TIME}, {MISTRAL_TIME}]", False, False),
        ('[TOOL_CALLS] [{"name": "time", "arguments": {"city": "Oslo"}}]', True, False),
        ("[TOOL_CALLS] It is sunny.", True, False),
    ],
)  # fmt: skip
def test_mistral_calls_open_with_its_token(
    tokenizer: Tokenizer, text: str, parallel: bool, follows: bool
) -> None:
    made = _plan(Mistral(_marker(tokenizer)), parallel)
    assert _follows(tokenizer, made, text) is follows


def test_mistral_calls_read_back_with_the_token_shown_or_not(tokenizer: Tokenizer) -> None:
    made = _plan(Mistral(_marker(tokenizer)))
    shown = made.calls(MISTRAL_CALL, "c")
    assert [(c.function.name, json.loads(c.function.arguments)) for c in shown or []] == [
        ("weather", {"city": "Oslo"})
    ]  # fmt: skip
    skipped = MISTRAL_CALL.removeprefix("[TOOL_CALLS]")  # skip_special_tokens, the default
    assert made.calls(skipped, "c") == shown
    assert [made.sendable(said, False) for said in ("", "[TOOL_CALLS]", ' [{"na', "It")] == [
        0, 0, 0, 2
    ]  # fmt: skip


MISTRAL_TEMPLATE = """{{ tools | length }}{% for m in messages %}
{%- if m.tool_calls %}[TOOL_CALLS] {% for c in m.tool_calls %}{% if c.id | length != 9 %}
{{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}{% endif %}
{{- c.id }} {% endfor %}{% elif m.role == 'tool' %}{% if m.tool_call_id | length != 9 %}
{{- raise_exception("bad id") }}{% endif %}[TOOL_RESULTS] {{ m.tool_call_id }}
{%- else %}[INST] {{ m.content }}{% endif %}{% endfor %}"""
"""The part of Mistral's template that checks call ids."""


def test_call_ids_are_nine_characters_for_a_template_that_wants_them(
    tmp_path: Path, tokenizer: Tokenizer
) -> None:
    """Mistral's template refuses any id but nine letters and digits (OpenAI's and Kiln's
    are longer): an assistant's calls and the tool's answers get the same nine made from
    each id."""
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": MISTRAL_TEMPLATE}))
    model = load_text_model(tmp_path, "tokenizer.json")
    assert model.nine_ids
    call = {"id": "call-0f3a_0_0", "type": "function",
            "function": {"name": "time", "arguments": "{}"}}  # fmt: skip
    said = [{"role": "user", "content": "Hi"}, {"role": "assistant", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call-0f3a_0_0", "content": "noon"}]  # fmt: skip
    request = msgspec.convert({"model": "m", "messages": said, "tools": TOOLS},
                              ChatCompletionRequest)  # fmt: skip
    text = model.tokenizer.decode(chat_prompt(request, model), skip_special_tokens=False)
    ids = re.findall(r"\[TOOL_CALLS\] (\w+) |\[TOOL_RESULTS\] (\w+)", text)
    (made, _), (_, answered) = ids
    assert made == answered
    assert len(made) == 9


ARGS_CALL = '[TOOL_CALLS]weather[ARGS]{"city": "Oslo"}'


def _args_format(tokenizer: Tokenizer) -> MistralArgs:
    made = taught("{{ tools }}[TOOL_CALLS][ARGS]", tokenizer)
    assert isinstance(made, MistralArgs)
    return made


@pytest.mark.parametrize(
    ("text", "parallel", "follows"),
    [
        ("It is sunny in Oslo.", True, True),
        (ARGS_CALL, True, True),
        (f"{ARGS_CALL}[TOOL_CALLS]time[ARGS]{{}}", True, True),
        (f"{ARGS_CALL}[TOOL_CALLS]time[ARGS]{{}}", False, False),
        ('[TOOL_CALLS]weather[ARGS]{"days": 2}', True, False),
        ('[TOOL_CALLS]nope[ARGS]{}', True, False),
        ('weather{"city": "Oslo"}', True, False),  # what a call reads as, without its tokens
    ],
)  # fmt: skip
def test_newer_mistral_calls_are_token_name_token_arguments(
    tokenizer: Tokenizer, text: str, parallel: bool, follows: bool
) -> None:
    """Magistral's, Devstral's and Ministral 3's: ``[TOOL_CALLS]NAME[ARGS]{…}`` a call."""
    assert _follows(tokenizer, _plan(_args_format(tokenizer), parallel), text) is follows


def test_newer_mistral_calls_read_back_with_their_tokens_shown_or_not(
    tokenizer: Tokenizer,
) -> None:
    made = _plan(_args_format(tokenizer))
    both = f"{ARGS_CALL}[TOOL_CALLS]time[ARGS]{{}}"
    calls = made.calls(both, "c")
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls or []] == [
        ("weather", {"city": "Oslo"}), ("time", {})
    ]  # fmt: skip
    assert made.calls(both.replace("[TOOL_CALLS]", "").replace("[ARGS]", ""), "c") == calls
    assert made.calls("weathering the storm", "c") is None
    said = ["", "weat", "weather{", "weathering", "It"]
    assert [made.sendable(s, False) for s in said] == [0, 0, 0, 10, 2]
