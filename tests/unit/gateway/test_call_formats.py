"""Tool calls in the format a model's chat template teaches (``tool_choice: "auto"``): which
format a template teaches, the grammar each holds an answer to, and calls read back."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jinja2
import llguidance
import msgspec
import pytest
from tokenizers import AddedToken, Tokenizer

from kiln_platform.gateway._call_formats import (
    HERMES,
    JSON,
    Apertus,
    CallFormat,
    Mistral,
    MistralArgs,
)
from kiln_platform.gateway._call_values import raw
from kiln_platform.gateway._chat_jinja import chat_environment
from kiln_platform.gateway._prompts import chat_prompt
from kiln_platform.gateway._python_calls import Pythonic
from kiln_platform.gateway._tagged_calls import GLM, GLM47, MINIMAX, SEED, XML
from kiln_platform.gateway._taught import taught
from kiln_platform.gateway._textmodel import load_text_model
from kiln_platform.gateway._tools import ToolPlan, marked, plan
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
    """A byte-level BPE with Mistral's ``[TOOL_CALLS]`` and ``[ARGS]``, Granite 3's
    ``<|tool_call|>``, Apertus's ``<|tools_prefix|>`` and ``<|tools_suffix|>`` and LFM2's
    ``<|tool_call_start|>`` and ``<|tool_call_end|>``, special tokens."""
    tok = byte_bpe([XML_CALL, XML_TIME, JSON_CALL, JSON_TIME, "It is sunny in Oslo."] * 20)
    specials = ("[TOOL_CALLS]", "[ARGS]", "<|tool_call|>", "<|tools_prefix|>",
                "<|tools_suffix|>", "<|tool_call_start|>", "<|tool_call_end|>")  # fmt: skip
    tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
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


SEED_CALLS = """{%- for call in calls %}
{{ "\\n<seed:tool_call>\\n<function=" + call.name + ">\\n" }}
{%- for name, value in call.arguments | items %}
{{ "<parameter=" + name + ">" }}
{%- set value = value if value is string else value | string %}
{{ value + "</parameter>\\n" }}
{%- endfor %}
{{ "</function>\\n</seed:tool_call>" }}
{%- endfor %}"""
"""How Seed-OSS's template writes calls (its words; a value not a string through ``string``)."""
GLM_CALLS = """{% for tc in calls %}
{{ '\\n<tool_call>' + tc.name }}
{% set _args = tc.arguments or {} %}
{% for k, v in _args.items() %}
<arg_key>{{ k }}</arg_key>
<arg_value>{{ v | tojson(ensure_ascii=False) if v is not string else v }}</arg_value>
{% endfor %}
</tool_call>{% endfor %}"""
"""How GLM-4.5's and 4.6's template writes calls (its words)."""
GLM47_CALLS = GLM_CALLS.replace("tc.name }}\n", "tc.name }}").replace("</arg_key>\n", "</arg_key>")
GLM47_CALLS = GLM47_CALLS.replace("</arg_value>\n", "</arg_value>")
MINIMAX_CALLS = """{{- '\\n' ~ '<minimax:tool_call>' ~ '\\n' }}
{%- for tool_call in calls -%}
    {{- '<invoke name="' + tool_call.name + '">\\n' }}
    {%- if tool_call.arguments is defined and tool_call.arguments is mapping -%}
    {% set _args = tool_call.arguments %}
    {%- for k, v in _args|items %}
    {{- '<parameter name="' + k + '">' }}
    {{- v | tojson | string if v is not string else v }}
    {{- '</parameter>' }}
    {% endfor %}{%- endif -%}
    {{- '</invoke>' ~ '\\n' }}
{%- endfor -%}
{{- '</minimax:tool_call>' }}"""
"""How MiniMax-M2's template writes calls (its words, and its blank space)."""


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        (SEED_CALLS, SEED),
        ("For each function call, output the function name and arguments within the following "
         "XML format:\n<tool_call>{function-name}\n<arg_key>{arg-key-1}</arg_key>\n<arg_value>"
         "{arg-value-1}</arg_value>", GLM),
        ("<tool_call>{function-name}<arg_key>{arg-key-1}</arg_key><arg_value>{arg-value-1}"
         "</arg_value>...</tool_call>", GLM47),
        (MINIMAX_CALLS, MINIMAX),
    ],
)  # fmt: skip
def test_seed_glm_and_minimax_templates_teach_their_tags(
    template: str, expected: CallFormat
) -> None:
    """Seed-OSS's block holds Qwen's ``<function=`` tags: its own tell is read first."""
    assert taught(template, byte_bpe(["x"])) is expected


@pytest.mark.parametrize(
    ("call_format", "template"),
    [(SEED, SEED_CALLS), (GLM, GLM_CALLS), (GLM47, GLM47_CALLS), (MINIMAX, MINIMAX_CALLS)],
)
def test_calls_written_as_seeds_glms_and_minimaxs_templates_write_them_are_read_back(
    tokenizer: Tokenizer, call_format: CallFormat, template: str
) -> None:
    """The calls a chat's history shows the model (rendered as Kiln renders templates) are
    what the grammar takes, and read back to the same arguments; words may come first."""
    arguments = {"city": "St. Louis,\n<b>MO</b>", "days": 3, "unit": "F"}
    written = (
        chat_environment()
        .from_string(template)
        .render(
            calls=[{"name": "weather", "arguments": arguments}, {"name": "time", "arguments": {}}]
        )
    )
    made = _plan(call_format)
    assert _follows(tokenizer, made, written)
    assert _follows(tokenizer, made, f"Let me look.{written}")
    assert not _follows(tokenizer, _plan(call_format, parallel=False), written)
    calls = made.calls(f"Let me look.{written}", "c") or []
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("weather", arguments), ("time", {})
    ]  # fmt: skip
    assert made.preface(f"Let me look.{written}") == "Let me look."
    assert [made.sendable(s, False) for s in ("Sun", "Sun <", f"Sun {call_format.open[:-1]}")] == [
        3, 3, 3
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "follows"),
    [
        ("<seed:tool_call>\n<function=weather>\n<parameter=city>Oslo</parameter>\n</function>"
         "\n</seed:tool_call>", True),
        ("<seed:tool_call>\n<function=weather>\n<parameter=days>3</parameter>\n</function>"
         "\n</seed:tool_call>", False),  # the required city missing
        ("<seed:tool_call>\n<function=weather>\n<parameter=city>Oslo</parameter>\n"
         "<parameter=days>three</parameter>\n</function>\n</seed:tool_call>", False),
        ("<seed:tool_call>\n<function=time>\n</function>\n</tool_call>", False),
        ("<seed:tool_call>\n<function=nope>\n</function>\n</seed:tool_call>", False),
        ("<tool_call>\n<function=time>\n</function>\n</tool_call>", True),  # text to Seed
    ],
)  # fmt: skip
def test_seed_calls_hold_each_parameter_to_its_schema(
    tokenizer: Tokenizer, text: str, follows: bool
) -> None:
    assert _follows(tokenizer, _plan(SEED), text) is follows


def test_minimax_calls_are_one_block(tokenizer: Tokenizer) -> None:
    """MiniMax-M2's calls share one block: one call in it unless parallel, and no second."""
    one = '<invoke name="weather">\n<parameter name="city">Oslo</parameter>\n</invoke>\n'
    two = one + '<invoke name="time">\n</invoke>\n'
    block = "<minimax:tool_call>\n{}</minimax:tool_call>"
    assert _follows(tokenizer, _plan(MINIMAX, parallel=False), block.format(one))
    assert not _follows(tokenizer, _plan(MINIMAX, parallel=False), block.format(two))
    assert not _follows(tokenizer, _plan(MINIMAX), block.format(one) + block.format(one))
    assert not _follows(tokenizer, _plan(MINIMAX), block.format(one.replace("Oslo", "")[:-9]))
    words = f"Call {one}? No.\n{block.format(one)}"
    calls = _plan(MINIMAX).calls(words, "c") or []
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("weather", {"city": "Oslo"})
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "follows"),
    [
        ("<tool_call>weather\n<arg_key>city</arg_key>\n<arg_value>Oslo</arg_value>\n"
         "<arg_key>where</arg_key>\n<arg_value>{\"lat\": 1}</arg_value>\n</tool_call>", True),
        ("<tool_call>weather\n<arg_key>city</arg_key>\n<arg_value>Oslo</arg_value>\n"
         "<arg_key>unit</arg_key>\n<arg_value>K</arg_value>\n</tool_call>", False),
        ("<tool_call>nope\n</tool_call>", False),
        ("<tool_call>\n{\"name\": \"time\", \"arguments\": {}}\n</tool_call>", False),
    ],
)  # fmt: skip
def test_glm_calls_hold_each_parameter_to_its_schema(
    tokenizer: Tokenizer, text: str, follows: bool
) -> None:
    assert _follows(tokenizer, _plan(GLM), text) is follows


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


GRANITE_CALLS = """{%- if message.tool_calls %}
{{- '<|start_of_role|>assistant<|end_of_role|><|tool_call|>' + message.tool_calls | tojson }}
{{- '<|end_of_text|>' }}{% endif %}"""
"""How Granite 3's template writes calls (its words)."""


def test_granites_template_teaches_its_token_and_mistrals_list(tokenizer: Tokenizer) -> None:
    made = taught(GRANITE_CALLS, tokenizer)
    assert isinstance(made, Mistral)
    assert (made.token_id, made.marker) == (tokenizer.token_to_id("<|tool_call|>"), "<|tool_call|>")
    assert taught(GRANITE_CALLS, byte_bpe(["x"])) is HERMES  # no such token
    written = (
        chat_environment()
        .from_string(GRANITE_CALLS)
        .render(message={"tool_calls": [{"name": "weather", "arguments": {"city": "Oslo"}}]})
    )
    calls = written.removeprefix("<|start_of_role|>assistant<|end_of_role|>").removesuffix(
        "<|end_of_text|>"
    )
    made_plan = _plan(made, parallel=False)
    assert _follows(tokenizer, made_plan, calls)
    assert not _follows(tokenizer, made_plan, calls.replace("<|tool_call|>", ""))
    for shown in (calls, calls.removeprefix("<|tool_call|>")):  # skip_special_tokens or not
        read = made_plan.calls(shown, "c") or []
        assert [(c.function.name, json.loads(c.function.arguments)) for c in read] == [
            ("weather", {"city": "Oslo"})
        ]  # fmt: skip


APERTUS_CALL = '<|tools_prefix|>[{"weather": {"city": "Oslo"}}, {"time": {}}]<|tools_suffix|>'


@pytest.mark.parametrize(
    ("text", "parallel", "follows"),
    [
        ("It is sunny in Oslo.", True, True),
        (APERTUS_CALL, True, True),
        (f"Let me look. {APERTUS_CALL}", True, True),  # words, then calls
        (APERTUS_CALL, False, False),
        ('<|tools_prefix|>[{"time": {}}]<|tools_suffix|>', False, True),
        ('<|tools_prefix|>[{"weather": {"days": 2}}]<|tools_suffix|>', True, False),
        ('<|tools_prefix|>[{"time": {}, "weather": {}}]<|tools_suffix|>', True, False),
        ('<|tools_prefix|>[{"time": {}}]', True, False),  # unclosed
    ],
)  # fmt: skip
def test_apertus_calls_are_a_list_between_its_tokens(
    tokenizer: Tokenizer, text: str, parallel: bool, follows: bool
) -> None:
    made = taught("{{ '<|tools_prefix|>' + calls | tojson + '<|tools_suffix|>' }}", tokenizer)
    assert isinstance(made, Apertus)
    assert _follows(tokenizer, _plan(made, parallel), text) is follows


def test_apertus_calls_read_back_from_a_text_that_keeps_its_tokens(tokenizer: Tokenizer) -> None:
    """Its tokens are special: a chat that may call keeps them in its text (``marked``), as
    vLLM's parser turns ``skip_special_tokens`` off, so words and calls part."""
    made = _plan(Apertus(1, 2))
    calls = made.calls(f"Let me look. {APERTUS_CALL}", "c") or []
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("weather", {"city": "Oslo"}), ("time", {})
    ]  # fmt: skip
    assert made.preface(f"Let me look. {APERTUS_CALL}") == "Let me look."
    assert made.calls("It is sunny.", "c") is None
    model = SimpleNamespace(harmony=None)
    assert marked(made, model)  # type: ignore[arg-type]
    assert not marked(_plan(XML), model)  # type: ignore[arg-type]
    assert not marked(None, model)  # type: ignore[arg-type]
    assert marked(None, SimpleNamespace(harmony=(1, 2, 3, 4)))  # type: ignore[arg-type]


LFM2_CALLS = """{%- macro format_arg_value(arg_value) -%}
    {%- if arg_value is string -%}{{- "'" + arg_value + "'" -}}
    {%- elif arg_value is mapping -%}{{- arg_value | tojson -}}
    {%- else -%}{{- arg_value | string -}}{%- endif -%}
{%- endmacro -%}
{%- set tool_calls_ns = namespace(tool_calls=[]) -%}
{%- for tool_call in calls -%}
    {%- set args_ns = namespace(arg_strings=[]) -%}
    {%- for arg_name, arg_value in tool_call["arguments"].items() -%}
        {%- set args_ns.arg_strings = args_ns.arg_strings + [arg_name + "=" +
            format_arg_value(arg_value)] -%}
    {%- endfor -%}
    {%- set tool_calls_ns.tool_calls = tool_calls_ns.tool_calls + [tool_call["name"] + "(" +
        (args_ns.arg_strings | join(", ")) + ")"] -%}
{%- endfor -%}
{{- "<|tool_call_start|>[" + (tool_calls_ns.tool_calls | join(", ")) + "]<|tool_call_end|>" -}}"""
"""How LFM2.5's template writes calls (its words)."""
FLAG = {"type": "object", "properties": {"on": {"type": "boolean"}, "note": {"type": "string"},
        "unit": {"enum": ["C", "F"]}}, "required": ["on"]}  # fmt: skip


def test_lfm2_calls_are_a_python_list_between_its_tokens(tokenizer: Tokenizer) -> None:
    """LFM2's calls as its template writes them in a chat's history are what the grammar
    takes (after words), read back to the same arguments; booleans are Python's."""
    made = taught(LFM2_CALLS, tokenizer)
    assert isinstance(made, Pythonic)
    tools = [*TOOLS, {"type": "function", "function": {"name": "flag", "parameters": FLAG}}]
    made_plan = plan(tools, "auto", True)
    assert made_plan is not None
    made_plan = made_plan.written(made)
    said = [{"name": "weather", "arguments": {"city": "St. Louis\n<b>MO</b>", "days": 3,
                                              "where": {"lat": 38.6}}},
            {"name": "time", "arguments": {}},
            {"name": "flag", "arguments": {"on": False, "unit": "F"}}]  # fmt: skip
    written = chat_environment().from_string(LFM2_CALLS).render(calls=said)
    assert _follows(tokenizer, made_plan, written)
    assert _follows(tokenizer, made_plan, f"Let me look. {written}")
    read = made_plan.calls(f"Let me look. {written}", "c") or []
    assert [(c.function.name, json.loads(c.function.arguments)) for c in read] == [
        (call["name"], call["arguments"]) for call in said
    ]
    assert made_plan.preface(f"Let me look. {written}") == "Let me look."
    bad = ["<|tool_call_start|>[flag(note='x')]<|tool_call_end|>",  # "on" is required
           "<|tool_call_start|>[flag(on=true)]<|tool_call_end|>",  # Python's, not JSON's
           "<|tool_call_start|>[flag(unit='F', on=True)]<|tool_call_end|>",  # schema order
           "<|tool_call_start|>[weather(city='Oslo', days='3')]<|tool_call_end|>",
           "<|tool_call_start|>[nope()]<|tool_call_end|>",
           "<|tool_call_start|>[time()]"]  # fmt: skip
    assert [_follows(tokenizer, made_plan, text) for text in bad] == [False] * len(bad)
    assert _follows(tokenizer, made_plan, "<|tool_call_start|>[flag(on=True, note='a, b')]"
                    "<|tool_call_end|>")  # fmt: skip
    one = made_plan.calls("<|tool_call_start|>[flag(on=True, note='a, b')]<|tool_call_end|>", "c")
    assert [json.loads(c.function.arguments) for c in one or []] == [{"on": True, "note": "a, b"}]
    assert marked(made_plan, SimpleNamespace(harmony=None))  # type: ignore[arg-type]


def test_tags_a_tokenizer_has_as_special_tokens_are_those_tokens(tmp_path: Path) -> None:
    """Some fine-tunes' ``<tool_call>`` (and GLM-4.7's tags) are special tokens: the grammar
    names them by id (text cannot spell them), and the chat's text keeps them (``marked``),
    as vLLM turns ``skip_special_tokens`` off; words before and a text answer as before."""
    glm = ("<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>")
    tok = byte_bpe([JSON_CALL, "It is sunny in Oslo.", "weather city Oslo"] * 20)
    tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in glm])
    hermes = taught("{{ tools }}", tok)
    assert hermes.marked
    assert set(hermes.specials) == {"<tool_call>", "</tool_call>"}
    call = '<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    made = _plan(hermes)
    for text in ("It is sunny.", call, f"Let me look.\n{call}", f"{call}\n{call}"):
        assert _follows(tok, made, text), text
    assert not _follows(tok, made, call.replace("Oslo", "Oslo\n"))
    assert [c.function.name for c in made.calls(f"Let me look.\n{call}", "c") or []] == ["weather"]
    assert made.preface(f"Let me look.\n{call}") == "Let me look."
    assert marked(made, SimpleNamespace(harmony=None))  # type: ignore[arg-type]
    glm47 = taught("<arg_key>{k}</arg_key><arg_value>{v}</arg_value>", tok)
    assert glm47.specials.keys() == set(glm)
    said = "<tool_call>weather<arg_key>city</arg_key><arg_value>Oslo</arg_value></tool_call>"
    assert _follows(tok, _plan(glm47), f"Sure.{said}")
    assert not _follows(tok, _plan(glm47), said.replace("city", "town"))
    assert [json.loads(c.function.arguments) for c in _plan(glm47).calls(said, "c") or []] == [
        {"city": "Oslo"}
    ]  # fmt: skip
    assert taught("{{ tools }}", byte_bpe(["x"])).specials == {}


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
