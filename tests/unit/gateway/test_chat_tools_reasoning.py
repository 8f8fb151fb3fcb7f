"""A reasoning model's chat answer with tools: its reasoning apart, then its calls (or its
text), whole and streamed alike; streamed, the reasoning comes as it is written while the
answer after it is held until it cannot be a call."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest

from kiln_platform.gateway._reasoning import Think
from kiln_platform.gateway._tools import plan
from kiln_platform.gateway.completions import complete_chat, stream_chat
from kiln_platform.gateway.llm import Piece

OPEN, CLOSE = 7, 8
CALL = '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"x": {"type": "integer"}}}}}]  # fmt: skip


def _gen(pieces: list[Piece], choice: Any = "auto") -> Any:
    """What the builders read of a generation (one choice, its prompt leaving ``<think>``
    open)."""

    async def arrived() -> Any:
        for piece in pieces:
            yield piece

    return SimpleNamespace(
        request=SimpleNamespace(request_id="req_1", logprobs=None), name="m",
        model=SimpleNamespace(think=Think(OPEN, CLOSE), harmony=None, tokenizer=None),
        tools=plan(TOOLS, choice, None),
        choices=[SimpleNamespace(index=0, request=SimpleNamespace(prompt_ids=[1, OPEN]),
                                 tokens=[4, 5, CLOSE, 6])],
        version=SimpleNamespace(version=1, artifact_digest="sha256:ab"),
        admission=SimpleNamespace(service_tier="default"), cached_tokens=0,
        usage_counts=lambda: (2, 3, 5), pieces=arrived,
    )  # fmt: skip


async def _streamed(gen: Any) -> list[dict[str, Any]]:
    events = [e async for e in stream_chat(gen, None)]
    assert events[-1] == b"data: [DONE]\n\n"
    return [json.loads(e[6:])["choices"][0] for e in events[:-1]]


@pytest.mark.parametrize(
    "texts",
    [["hm", "m</think>\n\n<tool_", CALL.removeprefix("<tool_")],
     ["hmm</think>", "\n\n", CALL],
     ["hmm</think>" + CALL]],
)  # fmt: skip
async def test_calls_after_reasoning_whole_and_streamed_alike(texts: list[str]) -> None:
    pieces = [Piece(t, "stop" if i == len(texts) - 1 else None) for i, t in enumerate(texts)]
    done = msgspec.to_builtins(await complete_chat(_gen(pieces)))
    assert done["usage"]["completion_tokens_details"] == {"reasoning_tokens": 3}  # to the tag
    whole = done["choices"][0]
    assert whole["finish_reason"] == "tool_calls"
    message = whole["message"]
    assert (message["content"], message["reasoning"]) == (None, "hmm")
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in message["tool_calls"]] == [("f", {"x": 1})]  # fmt: skip
    chunks = await _streamed(_gen(pieces))
    deltas = [c["delta"] for c in chunks]
    thought = "".join(d.get("reasoning") or "" for d in deltas)
    calls = [{k: v for k, v in call.items() if k != "index"}
             for d in deltas for call in d.get("tool_calls") or []]  # fmt: skip
    assert thought == "hmm"
    assert calls == message["tool_calls"]
    assert not any(d.get("content") for d in deltas)
    assert chunks[-1]["finish_reason"] == "tool_calls"
    said = [i for i, d in enumerate(deltas) if d.get("reasoning")]
    assert said[-1] < next(i for i, d in enumerate(deltas) if d.get("tool_calls"))


async def test_text_after_reasoning_is_streamed_once_it_cannot_be_a_call() -> None:
    pieces = [Piece("hm"), Piece("m</think>"), Piece("\n\n"), Piece("It"), Piece(" is.", "stop")]
    message = msgspec.to_builtins(await complete_chat(_gen(pieces)))["choices"][0]["message"]
    assert (message["content"], message["reasoning"]) == ("\n\nIt is.", "hmm")
    deltas = [c["delta"] for c in await _streamed(_gen(pieces))]
    assert [d.get("content") for d in deltas if d.get("content")] == ["\n\nIt", " is."]
    assert "".join(d.get("reasoning") or "" for d in deltas) == "hmm"


async def test_a_named_functions_arguments_follow_the_reasoning() -> None:
    named = {"type": "function", "function": {"name": "f"}}
    pieces = [Piece("hmm</think>\n\n"), Piece('{"x": 2}', "stop")]
    choice = msgspec.to_builtins(await complete_chat(_gen(pieces, named)))["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["message"]["reasoning"] == "hmm"
    assert json.loads(choice["message"]["tool_calls"][0]["function"]["arguments"]) == {"x": 2}
