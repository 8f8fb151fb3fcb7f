"""A streamed chat completion kept with ``store: true`` is the completion its chunks make up:
choices by index, text joined, whole tool calls, log-probabilities, each choice's finish."""

from __future__ import annotations

import msgspec

from kiln_platform.gateway.chat_kept import assembled
from kiln_platform.gateway.chat_store import message_item
from kiln_platform.gateway.llm_schemas import (
    ChatCompletionChunk,
    ChoiceLogprobs,
    ChunkChoice,
    Delta,
    FunctionCall,
    TokenLogprob,
    ToolCallDelta,
    Usage,
)

USAGE = Usage(prompt_tokens=5, completion_tokens=4, total_tokens=9)


def _chunk(index: int, delta: Delta, finish: str | None = None,
           logprobs: ChoiceLogprobs | None = None) -> ChatCompletionChunk:  # fmt: skip
    choice = ChunkChoice(delta=delta, finish_reason=finish, index=index, logprobs=logprobs)
    return ChatCompletionChunk(id="chatcmpl-1", created=7, model="m", choices=[choice],
                               system_fingerprint="kiln-1-ab")  # fmt: skip


def test_interleaved_choices_join_by_index() -> None:
    chunks = [
        _chunk(0, Delta(role="assistant", content="")),
        _chunk(1, Delta(role="assistant", content="")),
        _chunk(1, Delta(content="Bon")),
        _chunk(0, Delta(content="Hel")),
        _chunk(0, Delta(content="lo")),
        _chunk(1, Delta(content="jour")),
        _chunk(1, Delta(), "length"),
        _chunk(0, Delta(), "stop"),
        ChatCompletionChunk(id="chatcmpl-1", created=7, model="m", choices=[], usage=USAGE),
    ]
    kept = assembled(chunks, USAGE)
    said = [(c.index, c.message.content, c.finish_reason) for c in kept.choices]
    assert said == [(0, "Hello", "stop"), (1, "Bonjour", "length")]
    assert (kept.id, kept.created, kept.model, kept.object) == (
        "chatcmpl-1",
        7,
        "m",
        "chat.completion",
    )
    assert (kept.usage, kept.system_fingerprint) == (USAGE, "kiln-1-ab")


def test_tool_calls_are_kept_whole_without_text() -> None:
    call = ToolCallDelta(index=0, id="call_1", function=FunctionCall(name="f", arguments="{}"))
    chunks = [
        _chunk(0, Delta(role="assistant", content="")),
        _chunk(0, Delta(tool_calls=[call])),
        _chunk(0, Delta(), "tool_calls"),
    ]
    (choice,) = assembled(chunks, USAGE).choices
    assert choice.message.content is None
    assert choice.finish_reason == "tool_calls"
    assert msgspec.to_builtins(choice.message.tool_calls) == [
        {"id": "call_1", "function": {"name": "f", "arguments": "{}"}, "type": "function"}
    ]


def test_logprobs_follow_the_text() -> None:
    def lp(token: str) -> ChoiceLogprobs:
        return ChoiceLogprobs(content=[TokenLogprob(token=token, logprob=-0.5)])

    chunks = [
        _chunk(0, Delta(role="assistant", content="")),
        _chunk(0, Delta(content="a"), logprobs=lp("a")),
        _chunk(0, Delta(content="b"), logprobs=lp("b")),
        _chunk(0, Delta(), "stop"),
    ]
    (choice,) = assembled(chunks, USAGE).choices
    assert choice.logprobs is not None
    assert [t.token for t in choice.logprobs.content or []] == ["a", "b"]
    (plain,) = assembled([_chunk(0, Delta(content="x")), _chunk(0, Delta(), "stop")], USAGE).choices
    assert plain.logprobs is None


def test_a_message_lists_with_an_id_and_its_parts() -> None:
    parts = [{"type": "text", "text": "Say "}, {"type": "text", "text": "hi"}]
    listed = message_item("chatcmpl-1", 2, {"role": "user", "content": parts, "name": None})
    assert listed == {"id": "chatcmpl-1-2", "role": "user", "content": "Say hi",
                      "content_parts": parts}  # fmt: skip
    plain = message_item("chatcmpl-1", 0, {"role": "system", "content": "Be brief."})
    assert plain == {"id": "chatcmpl-1-0", "role": "system", "content": "Be brief.",
                     "content_parts": None}  # fmt: skip
