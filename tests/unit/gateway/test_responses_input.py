"""``_response_input.to_chat``: a Responses request becomes the chat completion it is, or a
400 naming the Responses field."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from kiln_platform.errors import BadRequest
from kiln_platform.gateway._response_input import to_chat
from kiln_platform.gateway.llm_schemas import ContentPart
from kiln_platform.gateway.responses_schemas import ResponsesRequest


def _request(**fields: Any) -> ResponsesRequest:
    return msgspec.convert({"model": "m", "input": "hi", **fields}, ResponsesRequest)


def test_instructions_lead_and_a_string_is_one_user_message() -> None:
    chat = to_chat(_request(instructions="Be brief.", max_output_tokens=7, temperature=0.5))
    assert [(m.role, m.content) for m in chat.messages] == [
        ("system", "Be brief."), ("user", "hi")
    ]  # fmt: skip
    assert (chat.max_completion_tokens, chat.temperature, chat.max_tokens) == (7, 0.5, None)


def test_items_keep_their_roles_and_text_parts_and_ignore_output_fields() -> None:
    history = [
        {"role": "developer", "content": "Rules."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"},
                                                        {"type": "input_text", "text": "b"}]},
        {"id": "msg-1", "type": "message", "role": "assistant", "status": "completed",
         "content": [{"type": "output_text", "text": "c", "annotations": [], "logprobs": []}]},
    ]  # fmt: skip
    chat = to_chat(_request(input=history, safety_identifier="u-1"))
    assert [m.role for m in chat.messages] == ["developer", "user", "assistant"]
    assert chat.messages[1].content == [ContentPart(type="text", text="a"),
                                        ContentPart(type="text", text="b")]  # fmt: skip
    assert chat.messages[2].content == [ContentPart(type="text", text="c")]
    assert chat.user == "u-1"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"input": []}, "input"),
        ({"input": [{"type": "computer_call_output", "call_id": "c"}]}, "input[0].type"),
        ({"input": [{"type": "function_call_output", "call_id": "c"}]}, "input[0].output"),
        ({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]},
         "input[0].arguments"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
        ({"input": [{"role": "user"}]}, "input[0].content"),
        ({"input": [{"role": "user", "content": [{"type": "input_file"}]}]},
         "input[0].content[0].type"),
        ({"text": {"verbosity": "high"}}, "text"),
        ({"text": {"format": {"type": "text"}, "stop": "x"}}, "text"),
        ({"truncation": "middle"}, "truncation"),
        ({"include": ["message.output_text.logprobs", "output_text.everything"]}, "include[1]"),
    ],
)  # fmt: skip
def test_what_it_cannot_map_is_a_400_naming_the_field(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(BadRequest) as refused:
        to_chat(_request(**fields))
    assert refused.value.param == param
    assert param.split("[", maxsplit=1)[0].split(".", maxsplit=1)[0] in refused.value.message


def test_reasoning_effort_is_chats_and_reasoning_items_are_left_out() -> None:
    """``reasoning.effort`` is the chat template's ``reasoning_effort``; a reasoning item sent
    back (as a stateless client sends a response's output) is not shown to the model."""
    given = [
        {"role": "user", "content": "a"},
        {"id": "rs-1", "type": "reasoning", "summary": [],
         "content": [{"type": "reasoning_text", "text": "hmm"}]},
        {"type": "message", "role": "assistant", "content": "b"},
    ]  # fmt: skip
    chat = to_chat(_request(input=given, reasoning={"effort": "low", "summary": "auto"}))
    assert [(m.role, m.content) for m in chat.messages] == [("user", "a"), ("assistant", "b")]
    assert chat.reasoning_effort == "low"
    assert to_chat(_request()).reasoning_effort is None
    with pytest.raises(msgspec.ValidationError, match=r"reasoning\.effort"):
        _request(reasoning={"effort": "extreme"})
    with pytest.raises(msgspec.ValidationError, match="unknown field `budget`"):
        _request(reasoning={"budget": 3})


def test_what_means_unused_is_accepted() -> None:
    chat = to_chat(_request(store=False, tools=[], tool_choice="auto", include=[],
                            text={"format": {"type": "text"}}, truncation="disabled",
                            service_tier="auto", prompt_cache_key="k", max_tool_calls=3,
                            reasoning={"effort": None}))  # fmt: skip
    assert [m.content for m in chat.messages] == ["hi"]


@pytest.mark.parametrize(
    ("fields", "logprobs", "top"),
    [
        ({"include": ["message.output_text.logprobs"]}, True, None),
        ({"include": ["message.output_text.logprobs"], "top_logprobs": 3}, True, 3),
        ({"top_logprobs": 2}, True, 2),
        ({"top_logprobs": 0}, None, 0),
        ({"include": ["reasoning.encrypted_content", "file_search_call.results"]}, None, None),
    ],
)  # fmt: skip
def test_included_logprobs_are_chats(fields: dict[str, Any], logprobs: Any, top: Any) -> None:
    """``include`` asks for the text's log-probabilities; what names items Kiln never makes
    (reasoning, hosted tools' results) is taken, with nothing to include."""
    chat = to_chat(_request(**fields))
    assert (chat.logprobs, chat.top_logprobs) == (logprobs, top)


def test_a_json_schema_text_format_is_chats_response_format() -> None:
    schema = {"type": "object"}
    fmt = {"type": "json_schema", "name": "p", "schema": schema, "strict": True}
    chat = to_chat(_request(text={"format": fmt, "verbosity": "medium"}))
    assert chat.response_format == {"type": "json_schema", "json_schema": {"schema": schema}}
    chat = to_chat(_request(text={"format": {"type": "json_object"}}))
    assert chat.response_format == {"type": "json_object"}


def test_function_calls_and_their_outputs_are_chat_history() -> None:
    tools = [{"type": "function", "name": "f", "parameters": {"type": "object"}}]
    chat = to_chat(_request(tools=tools, tool_choice={"type": "function", "name": "f"},
                            parallel_tool_calls=False, input=[
        {"role": "user", "content": "go"},
        {"type": "function_call", "call_id": "a", "name": "f", "arguments": "{}", "id": "fc-1"},
        {"type": "function_call", "call_id": "b", "name": "f", "arguments": '{"x": 1}'},
        {"type": "function_call_output", "call_id": "a", "output": "one"},
        {"type": "function_call_output", "call_id": "b",
         "output": [{"type": "input_text", "text": "tw"}, {"type": "input_text", "text": "o"}]},
    ]))  # fmt: skip
    assert chat.tools == [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    ]
    assert (chat.tool_choice, chat.parallel_tool_calls) == (
        {"type": "function", "function": {"name": "f"}}, False
    )  # fmt: skip
    assert [m.role for m in chat.messages] == ["user", "assistant", "tool", "tool"]
    assert [c["id"] for c in chat.messages[1].tool_calls or []] == ["a", "b"]
    assert [(m.tool_call_id, m.content) for m in chat.messages[2:]] == [("a", "one"), ("b", "two")]
