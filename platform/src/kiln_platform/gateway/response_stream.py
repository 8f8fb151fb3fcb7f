"""The Responses stream's events: ``response.created``, ``response.in_progress``, then each
output item's — a reasoning model's reasoning item (``response.reasoning_text.delta`` events)
before its message (``response.output_text.delta``), each added, its part added, its deltas as
the text comes, its ``done`` events — then ``response.completed`` (or ``response.incomplete``);
a failure after the start is an ``error`` event and ``response.failed``. Tool calls are sent
whole once the answer is: each ``function_call`` item added, its arguments (one delta), done."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

from kiln_platform.errors import KilnError
from kiln_platform.gateway._chat_calls import ident
from kiln_platform.gateway.completions import Answer, splitter
from kiln_platform.gateway.response_output import Item, answered, reasoned, response, scored
from kiln_platform.gateway.responses_schemas import (
    FunctionCallItem,
    OutputMessage,
    OutputText,
    ReasoningItem,
    ReasoningText,
    ResponseError,
    ResponseObject,
    ResponsesRequest,
)

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, Awaitable, Callable

    from kiln_platform.gateway._reasoning import Split
    from kiln_platform.gateway.llm import Generation, Piece

Events = list[tuple[str, dict[str, Any]]]


@dataclass(slots=True)
class _Live:
    """The output items the stream has opened (their index, by kind) and closed, the
    reasoning it sent, and the tokens whose log-probabilities it sent."""

    gen: Generation
    split: Split | None
    opened: dict[str, int] = field(default_factory=dict)
    closed: set[int] = field(default_factory=set)
    thought: str = ""
    held: str = ""
    """Words of the answer while they may be a tool call."""
    said: str = ""
    """The message's words sent."""
    sent: int = 0

    def at(self, kind: str) -> dict[str, Any]:
        ident_of = ident("rs" if kind == "reasoning" else "msg", self.gen)
        return {"item_id": ident_of, "output_index": self.opened[kind], "content_index": 0}

    def open(self, kind: str) -> Events:
        """Add a ``reasoning`` or ``message`` item, and its part."""
        index = self.opened[kind] = len(self.opened)
        item: Item
        if kind == "reasoning":
            item = ReasoningItem(id=ident("rs", self.gen), content=[], status="in_progress")
            part: Any = ReasoningText(text="")
        else:
            item = OutputMessage(id=ident("msg", self.gen), status="in_progress", content=[])
            part = OutputText(text="")
        return [("response.output_item.added", {"output_index": index, "item": item}),
                ("response.content_part.added", {**self.at(kind), "part": part})]  # fmt: skip

    def piece(self, answer: Answer, piece: Piece) -> Events:
        """The events a piece of the answer makes (text held while it may be a tool call, or
        a reasoning tag)."""
        answer.add(piece)
        if self.split is not None:
            return self.split_text(answer, *self.split.push(piece.text))
        return self.words(answer, piece.text)

    def words(self, answer: Answer, content: str) -> Events:
        """The answer's words sent, held while they may still be a tool call."""
        if self.gen.tools is not None:
            self.held += content
            ready = self.gen.tools.sendable(self.held, "message" in self.opened)
            content, self.held = self.held[:ready], self.held[ready:]
        return self.say(answer, content) if content else []

    def rest(self, item: Item, index: int) -> Events:
        """The last of a streamed message's words, held until its end (blank space, or what
        might have opened a call)."""
        if not isinstance(item, OutputMessage) or self.opened.get("message") != index:
            return []
        text = item.content[0].text
        if len(text) <= len(self.said):
            return []
        return [
            (
                "response.output_text.delta",
                {**self.at("message"), "delta": text[len(self.said) :], "logprobs": []},
            )
        ]

    def split_text(self, answer: Answer, thought: str, content: str) -> Events:
        events: Events = []
        if thought:
            if "reasoning" not in self.opened:
                events += self.open("reasoning")
            self.thought += thought
            events.append(("response.reasoning_text.delta", {**self.at("reasoning"),
                                                             "delta": thought}))  # fmt: skip
        return events + self.words(answer, content)

    def say(self, answer: Answer, text: str) -> Events:
        """A message delta (the reasoning item done first, the message added, if not yet)."""
        events: Events = []
        if "reasoning" in self.opened and (index := self.opened["reasoning"]) not in self.closed:
            self.closed.add(index)
            thought = [ReasoningText(text=self.thought)]
            events += finished(ReasoningItem(id=ident("rs", self.gen), content=thought), index,
                               opened=True)  # fmt: skip
        if "message" not in self.opened:  # the reasoning's tokens are past: none scored
            events += self.open("message")
            self.sent = max(self.sent, reasoned(self.gen, self.split))
        marks = scored(self.gen, answer, self.sent)
        self.sent += len(marks)
        self.said += text
        delta = {**self.at("message"), "delta": text, "logprobs": marks}
        return [*events, ("response.output_text.delta", delta)]


async def events(
    gen: Generation, request: ResponsesRequest, *, shell: ResponseObject | None,
    finish: Callable[[ResponseObject], Awaitable[ResponseObject]],
    ended: Callable[[ResponseObject], None] | None,
) -> AsyncGenerator[bytes, None]:  # fmt: skip
    """The stream of ``gen``'s response (from its stored ``shell``, a background one's);
    ``finish`` keeps the finished response, ``ended`` gets its end (failed or finished)."""
    created = shell.created_at if shell else int(time.time())
    numbers = itertools.count()

    def event(kind: str, **fields: Any) -> bytes:
        body = msgspec.json.encode({"type": kind, "sequence_number": next(numbers), **fields})
        return b"event: " + kind.encode() + b"\ndata: " + body + b"\n\n"

    started = response(gen, request, created)
    yield event("response.created", response=shell or started)
    yield event("response.in_progress", response=started)
    live, answer = _Live(gen, splitter(gen, 0)), Answer.of(gen)
    plain = gen.tools is None and live.split is None
    for kind, fields in live.open("message") if plain else []:
        yield event(kind, **fields)  # text from the start
    made: Events = []
    try:
        async for piece in gen.pieces():
            for kind, fields in live.piece(answer, piece):
                yield event(kind, **fields)
        if live.split is not None:
            made = live.split_text(answer, *live.split.flush())
    except KilnError as exc:
        yield event("error", code=exc.code, message=exc.message, param=exc.param)
        failure = ResponseError(code="server_error", message=exc.message)
        failed = response(gen, request, created, status="failed", error=failure)
        if ended is not None:
            ended(failed)
        yield event("response.failed", response=failed)
        return
    done = await finish(answered(gen, request, created, answer))
    if ended is not None:
        ended(done)
    for index, item in enumerate(done.output):
        if index not in live.closed:
            made += live.rest(item, index)
            made += finished(item, index, opened=index in live.opened.values())
    for kind, fields in made:
        yield event(kind, **fields)
    yield event(f"response.{done.status}", response=done)


def finished(item: Item, index: int, *, opened: bool) -> Events:
    """The events that finish one output item (and, unless its text was streamed as it came,
    open it and carry its text in one delta)."""
    at = {"item_id": item.id, "output_index": index}
    events: Events = []
    if isinstance(item, FunctionCallItem):
        started = msgspec.structs.replace(item, status="in_progress", arguments="")
        events += [
            ("response.output_item.added", {"output_index": index, "item": started}),
            ("response.function_call_arguments.delta", {**at, "delta": item.arguments}),
            ("response.function_call_arguments.done", {**at, "arguments": item.arguments}),
        ]
    else:
        part: OutputText | ReasoningText = item.content[0]
        at = {**at, "content_index": 0}
        kind = "reasoning_text" if isinstance(part, ReasoningText) else "output_text"
        marks = {} if isinstance(part, ReasoningText) else {"logprobs": part.logprobs}
        if not opened:
            start = msgspec.structs.replace(item, status="in_progress", content=[])
            events += [
                ("response.output_item.added", {"output_index": index, "item": start}),
                ("response.content_part.added", {**at, "part": type(part)(text="")}),
                (f"response.{kind}.delta", {**at, "delta": part.text, **marks}),
            ]
        events += [
            (f"response.{kind}.done", {**at, "text": part.text, **marks}),
            ("response.content_part.done", {**at, "part": part}),
        ]
    return [*events, ("response.output_item.done", {"output_index": index, "item": item})]
