"""A reasoning model's response, streamed: its reasoning item's events, done before its message
is added, and the same items as the whole response's (``response_output.output``)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import msgspec
import pytest

from kiln_platform.gateway._reasoning import Think
from kiln_platform.gateway._tools import plan
from kiln_platform.gateway.completions import Answer, splitter
from kiln_platform.gateway.llm import Piece
from kiln_platform.gateway.response_output import output
from kiln_platform.gateway.response_stream import _Live, finished

OPEN, CLOSE = 7, 8
CALL = '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'


def _gen(prompt: list[int], tokens: list[int]) -> Any:
    """What the stream reads of a generation: its request id, model's tags, choice, tools."""
    choice = SimpleNamespace(request=SimpleNamespace(prompt_ids=prompt), tokens=tokens)
    return SimpleNamespace(
        request=SimpleNamespace(request_id="req_1", logprobs=None), tools=None,
        model=SimpleNamespace(think=Think(OPEN, CLOSE), harmony=None,
                              tokenizer=SimpleNamespace(decode=lambda _: "")),
        choices=[choice],
    )  # fmt: skip


def _streamed(gen: Any, pieces: list[Piece]) -> tuple[list[tuple[str, Any]], Answer]:
    live, answer = _Live(gen, splitter(gen, 0)), Answer.of(gen)
    events = [e for piece in pieces for e in live.piece(answer, piece)]
    assert live.split is not None
    events += live.split_text(answer, *live.split.flush())
    status = "completed" if answer.finish == "stop" else "incomplete"
    items, _ = output(gen, answer, status)
    for index, item in enumerate(items):
        if index not in live.closed:
            events += live.rest(item, index)
            events += finished(item, index, opened=index in live.opened.values())
    return [(kind, msgspec.to_builtins(fields)) for kind, fields in events], answer


def test_reasoning_is_done_before_the_message_is_added() -> None:
    gen = _gen([1, OPEN], [4, 5, CLOSE, 6])
    pieces = [Piece("hm", None, 0, (4,)), Piece("m</think>", None, 0, (5, CLOSE)),
              Piece("\n\nA cat.", "stop", 0, (6,))]  # fmt: skip
    events, answer = _streamed(gen, pieces)
    assert [kind for kind, _ in events] == [
        "response.output_item.added", "response.content_part.added",
        "response.reasoning_text.delta", "response.reasoning_text.delta",
        "response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
    ]  # fmt: skip
    assert [f["output_index"] for _, f in events] == [0] * 7 + [1] * 6
    assert "".join(f["delta"] for k, f in events if k.endswith("reasoning_text.delta")) == "hmm"
    assert events[4][1]["text"] == "hmm"
    assert events[7][1]["item"] == {"type": "message", "id": "msg-1", "status": "in_progress",
                                    "content": [], "role": "assistant"}  # fmt: skip
    items, spent = output(gen, answer, "completed")
    whole = [msgspec.to_builtins(item) for item in items]
    assert [f["item"] for k, f in events if k == "response.output_item.done"] == whole
    assert whole[0]["content"] == [{"text": "hmm", "type": "reasoning_text"}]
    assert whole[1]["content"][0]["text"] == "\n\nA cat."
    assert spent == 3  # to the close tag, itself included


@pytest.mark.parametrize(
    ("prompt", "tokens", "texts", "kinds"),
    [
        ([1, OPEN], [4, 5], ["hm", "m"], ["reasoning"]),  # cut inside: no message
        ([1], [4, 5], ["A ", "cat"], ["message"]),  # never reasoned: the message alone
        ([1], [OPEN, 4], ["<think>", "a"], ["reasoning"]),  # opened by the model
    ],
)
def test_each_item_is_added_once_and_done_once(
    prompt: list[int], tokens: list[int], texts: list[str], kinds: list[str]
) -> None:
    gen = _gen(prompt, tokens)
    pieces = [Piece(t, None, 0, (i,)) for t, i in zip(texts, tokens, strict=True)]
    events, _ = _streamed(gen, [*pieces[:-1], Piece(texts[-1], "length", 0, (tokens[-1],))])
    added = [f["item"]["type"] for k, f in events if k == "response.output_item.added"]
    done = [f["item"] for k, f in events if k == "response.output_item.done"]
    assert added == [d["type"] for d in done] == kinds
    assert done[0]["status"] == "incomplete"


def test_reasoning_streams_while_the_calls_after_it_are_held() -> None:
    """With tools, the reasoning is streamed as it comes; the answer after it is held while it
    may be calls, which come whole after the reasoning item (``output``'s order)."""
    gen = _gen([1, OPEN], [4, CLOSE, 6, 9])
    gen.tools = plan([{"type": "function", "function": {"name": "f"}}], "auto", None)
    call = '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'
    pieces = [Piece("hm", None, 0, (4,)), Piece("</think>\n\n<tool_", None, 0, (CLOSE, 6)),
              Piece(call.removeprefix("<tool_"), "stop", 0, (9,))]  # fmt: skip
    events, answer = _streamed(gen, pieces)
    assert [kind for kind, _ in events] == [
        "response.output_item.added", "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done",
    ]  # fmt: skip
    items, spent = output(gen, answer, "completed")
    whole = [msgspec.to_builtins(item) for item in items]
    assert [f["item"] for k, f in events if k == "response.output_item.done"] == whole
    assert [(i["type"], i.get("name")) for i in whole] == [
        ("reasoning", None), ("function_call", "f")]  # fmt: skip
    assert spent == 2


def test_with_tools_a_reasoning_models_text_is_streamed_once_it_cannot_be_a_call() -> None:
    gen = _gen([1, OPEN], [4, CLOSE, 6, 9])
    gen.tools = plan([{"type": "function", "function": {"name": "f"}}], "auto", None)
    pieces = [Piece("hm</think>", None, 0, (4, CLOSE)), Piece("\n\n", None, 0, (6,)),
              Piece("Hi", "stop", 0, (9,))]  # fmt: skip
    events, _ = _streamed(gen, pieces)
    said = [f["delta"] for k, f in events if k == "response.output_text.delta"]
    assert said == ["\n\nHi"]


@pytest.mark.parametrize(
    ("texts", "deltas", "kinds"),
    [
        (["hm</think>", "Sure.", " Let me", "\n\n<tool_", CALL.removeprefix("<tool_")],
         ["Sure.", " Let me"], ["reasoning", "message", "function_call"]),
        (["hm</think>", "Hi", " there\n", "<tool", "s>"], ["Hi", " there", "\n<tools>"],
         ["reasoning", "message"]),  # held while it may open a call, then sent at the end
    ],
)  # fmt: skip
def test_words_before_calls_stream_as_a_message_before_them(
    texts: list[str], deltas: list[str], kinds: list[str]
) -> None:
    gen = _gen([1, OPEN], list(range(20, 20 + len(texts))))
    gen.tools = plan([{"type": "function", "function": {"name": "f"}}], "auto", None)
    pieces = [Piece(text, "stop" if i == len(texts) - 1 else None, 0, (20 + i,))
              for i, text in enumerate(texts)]  # fmt: skip
    events, answer = _streamed(gen, pieces)
    assert [f["delta"] for k, f in events if k == "response.output_text.delta"] == deltas
    items, _ = output(gen, answer, "completed")
    whole = [msgspec.to_builtins(item) for item in items]
    assert [i["type"] for i in whole] == kinds
    assert whole[1]["content"][0]["text"] == "".join(deltas)
    assert [f["item"] for k, f in events if k == "response.output_item.done"] == whole


def test_gpt_oss_analysis_streams_as_reasoning_and_final_as_the_message() -> None:
    """Harmony's channels (``_harmony``): the same items as a ``<think>`` model's, no marker
    in any event."""
    gen = _gen([1], list(range(20, 26)))
    gen.model.think, gen.model.harmony = None, (96, 97, 99, 98)
    texts = ["<|channel|>anal", "ysis<|message|>Hm", "m.<|end|><|start|>assistant",
             "<|channel|>final<|message|>A ", "cat.", ""]  # fmt: skip
    pieces = [Piece(t, "stop" if i == len(texts) - 1 else None, 0, (20 + i,))
              for i, t in enumerate(texts)]  # fmt: skip
    events, answer = _streamed(gen, pieces)
    items, _ = output(gen, answer, "completed")
    whole = [msgspec.to_builtins(item) for item in items]
    assert [(i["type"], i["content"][0]["text"]) for i in whole] == [
        ("reasoning", "Hmm."), ("message", "A cat.")]  # fmt: skip
    assert "".join(f["delta"] for k, f in events if k.endswith("text.delta")) == "Hmm.A cat."
    assert [f["item"] for k, f in events if k == "response.output_item.done"] == whole
