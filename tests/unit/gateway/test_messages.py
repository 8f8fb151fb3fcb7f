"""Anthropic's Messages request as a chat completion's, and a chat's chunks as Anthropic's
stream events (``gateway.messages``)."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest

from kiln_platform.errors import BadRequest
from kiln_platform.gateway.messages import MessagesRequest, chat_request, streamed


def _request(**fields: Any) -> MessagesRequest:
    return msgspec.convert({"model": "m", "max_tokens": 9, **fields}, MessagesRequest)


def test_a_conversation_with_tools_is_the_chats() -> None:
    call = {"type": "tool_use", "id": "t1", "name": "f", "input": {"x": 1}}
    chat = chat_request(_request(
        system=[{"type": "text", "text": "Be brief."}],
        messages=[
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm",
                                               "signature": ""}, call]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                          "content": [{"type": "text", "text": "42"}]},
                                         {"type": "text", "text": "So?"}]},
        ],
        tools=[{"name": "f", "input_schema": {"type": "object"}}],
        tool_choice={"type": "tool", "name": "f", "disable_parallel_tool_use": True},
        stop_sequences=["END"], top_k=5, thinking={"type": "disabled"},
        output_config={"effort": "max"},
    ))  # fmt: skip
    said = [msgspec.to_builtins(m) for m in chat.messages]
    assert [(m["role"], m.get("content")) for m in said] == [
        ("system", "Be brief."), ("user", "Hi"), ("assistant", None), ("tool", "42"),
        ("user", [{"type": "text", "text": "So?"}]),
    ]  # fmt: skip
    assert said[2]["tool_calls"] == [
        {"id": "t1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}
    ]
    assert said[3]["tool_call_id"] == "t1"
    assert chat.tools == [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    ]
    assert chat.tool_choice == {"type": "function", "function": {"name": "f"}}
    assert (chat.parallel_tool_calls, chat.stop, chat.top_k) == (False, ["END"], 5)
    assert (chat.include_reasoning, chat.reasoning_effort) == (False, "xhigh")


@pytest.mark.parametrize(
    ("fields", "param"),
    [({"messages": [{"role": "user", "content": [{"type": "image"}]}]},
      "messages[0].content[0].type"),
     ({"messages": [{"role": "user", "content": [{"type": "tool_use"}]}]},
      "messages[0].content[0].type"),
     ({"messages": [], "tools": [{"type": "bash_20250124", "name": "bash"}]}, "tools[0].type"),
     ({"messages": [], "tool_choice": {"type": "some"}}, "tool_choice.type"),
     ({"messages": [], "output_config": {"format": {"type": "regex"}}},
      "output_config.format.type"),
     ({"messages": [], "stop_sequences": ["a", "b", "c", "d", "e"]}, "stop_sequences")],
)  # fmt: skip
def test_what_kiln_cannot_take_is_a_400_naming_it(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(BadRequest) as refused:
        chat_request(_request(**fields))
    assert refused.value.param == param


async def test_chunks_become_blocks() -> None:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return b"data: " + json.dumps({"choices": [choice]}).encode() + b"\n\n"

    call = {"index": 0, "id": "c1", "function": {"name": "f", "arguments": '{"x": 1}'}}
    chunks = [chunk({"role": "assistant", "content": ""}), chunk({"reasoning": "h"}),
              chunk({"reasoning": "m"}), chunk({"content": "Ok."}), chunk({"tool_calls": [call]}),
              chunk({}, "tool_calls"),
              b'data: {"choices": [], "usage": {"completion_tokens": 7}}\n\n',
              b"data: [DONE]\n\n"]  # fmt: skip

    async def given() -> Any:
        for c in chunks:
            yield c

    gen: Any = SimpleNamespace(request=SimpleNamespace(request_id="req_1"), name="m",
                               prompt_tokens=3)  # fmt: skip
    events = [e async for e in streamed(gen, given())]
    parsed = [json.loads(e.split(b"\ndata: ", 1)[1]) for e in events]
    assert [(p["type"], p.get("index")) for p in parsed] == [
        ("message_start", None),
        ("content_block_start", 0), ("content_block_delta", 0), ("content_block_delta", 0),
        ("content_block_stop", 0),
        ("content_block_start", 1), ("content_block_delta", 1), ("content_block_stop", 1),
        ("content_block_start", 2), ("content_block_delta", 2), ("content_block_stop", 2),
        ("message_delta", None), ("message_stop", None),
    ]  # fmt: skip
    assert [p["content_block"]["type"] for p in parsed if p["type"] == "content_block_start"] == [
        "thinking", "text", "tool_use"]  # fmt: skip
    assert parsed[9]["delta"] == {"type": "input_json_delta", "partial_json": '{"x": 1}'}
    assert parsed[-2]["delta"]["stop_reason"] == "tool_use"
    assert parsed[-2]["usage"] == {"output_tokens": 7}
