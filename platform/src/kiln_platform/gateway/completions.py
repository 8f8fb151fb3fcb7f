"""Response and SSE stream builders for chat and text completions."""

from __future__ import annotations

import dataclasses
import functools
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import msgspec
from litestar.response import Stream

from kiln_platform.errors import KilnError
from kiln_platform.gateway import _logprobs
from kiln_platform.gateway._chat_calls import ident, release, tool_calls
from kiln_platform.gateway._harmony import Harmony
from kiln_platform.gateway._reasoning import Split
from kiln_platform.gateway.llm import Generation, Piece, sse
from kiln_platform.gateway.llm_schemas import (
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChunkChoice,
    Delta,
    PromptLogprobs,
    TextChoice,
    TextCompletion,
    TextLogprobs,
)
from kiln_platform.gateway.llm_usage import token_usage
from kiln_platform.gateway.schemas import ErrorBody, ErrorResponse
from kiln_platform.registry import lifecycle
from kiln_platform.registry.lifecycle import fingerprint

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator

    from kiln_platform.gateway.llm_schemas import StreamOptions
    from kiln_runtimes.protocol import TokenLogprobs

DONE = b"data: [DONE]\n\n"
SSE = "text/event-stream"


def streamed(gen: Generation, events: AsyncGenerator[bytes, None]) -> Stream:
    """An event stream (held to the generation's deadline by its admission), closed when the
    admission is left however the response ends (a send cut at the deadline leaves it
    suspended: closing it cancels the worker's sequence)."""
    gen.admission.closers.append(events.aclose)
    return Stream(events, media_type=SSE, headers=lifecycle.headers(gen.version))


@dataclass(slots=True)
class Answer:
    """One choice's text, finish reason, and tokens with log-probabilities (when asked)."""

    parts: list[str] = field(default_factory=list)
    finish: str = "stop"
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprobs] | None = None
    stop: str | int | None = None
    """vLLM's ``stop_reason``."""

    @classmethod
    def of(cls, gen: Generation) -> Answer:
        return cls(logprobs=[] if gen.request.logprobs is not None else None)

    def add(self, piece: Piece) -> None:
        self.parts.append(piece.text)
        self.finish = piece.finish_reason or self.finish
        self.stop = piece.stop if piece.finish_reason else self.stop
        if self.logprobs is not None and piece.logprobs is not None:
            self.token_ids.extend(piece.token_ids)
            self.logprobs.extend(piece.logprobs)


async def collect(gen: Generation) -> list[Answer]:
    """Every choice's answer, by index (the whole generation, billed)."""
    answers = [Answer.of(gen) for _ in gen.choices]
    async for piece in gen.pieces():
        answers[piece.index].add(piece)
    return answers


def splitter(gen: Generation, index: int) -> Split | None:
    """Choice ``index``'s split into reasoning and content (its tool calls, if any), if its
    model reasons in tags (``_reasoning``) or on harmony's channels (``_harmony``)."""
    think, prompt = gen.model.think, gen.choices[index].request.prompt_ids
    if gen.model.harmony is not None:
        return Harmony.opened(gen.model.harmony[2], prompt)
    return None if think is None else Split.after(think, prompt)


def _message(
    gen: Generation, index: int, answer: Answer, shown: bool
) -> tuple[AssistantMessage, str]:
    """Choice ``index``'s message and finish reason: its text or its tool calls, and a
    reasoning model's reasoning apart (left out if none, or unless ``shown``: vLLM's
    ``include_reasoning``)."""
    text, finish, split = "".join(answer.parts), answer.finish, splitter(gen, index)
    reasoning, content = ("", text) if split is None else split.whole(text)
    calls = tool_calls(gen, index, content, finish)
    if calls is not None and gen.tools is not None:
        finish = gen.tools.finish_reason
    elif split is None:
        return AssistantMessage(content=text), finish
    said = (gen.tools.preface(content) or None) if calls and gen.tools else content
    return AssistantMessage.reasoned(said, reasoning, shown=shown, tool_calls=calls), finish


async def complete_chat(
    gen: Generation, scored: int | None = None, *, reasoning: bool = True
) -> ChatCompletion:
    """A non-streamed chat completion (``scored``: vLLM's ``prompt_logprobs`` asked;
    ``reasoning``: a reasoning model's reasoning sent)."""
    answers = await collect(gen)
    choices = []
    for i, a in enumerate(answers):
        logprobs = None
        if a.logprobs is not None:
            logprobs = _logprobs.chat(gen.model, a.token_ids, a.logprobs)
        message, finish = _message(gen, i, a, reasoning)
        choices.append(ChatChoice(index=i, message=message, finish_reason=finish,
                                  logprobs=logprobs, stop_reason=a.stop))  # fmt: skip
    return ChatCompletion(
        id=ident("chatcmpl", gen),
        created=int(time.time()),
        model=gen.name,
        system_fingerprint=fingerprint(gen.version),
        service_tier=gen.admission.service_tier,
        choices=choices,
        usage=token_usage(gen, chat=True),
        prompt_logprobs=_prompt_scores(gen, 0, scored),
    )


async def complete_text(gen: Generation, scored: int | None = None) -> TextCompletion:
    """A non-streamed text completion (``echo`` puts each prompt before its answers;
    ``scored``: vLLM's ``prompt_logprobs`` asked)."""
    answers = await collect(gen)
    choices = []
    for choice, a in zip(gen.choices, answers, strict=True):
        logprobs = None
        if a.logprobs is not None:
            logprobs = _logprobs.text(gen.model, a.token_ids, a.logprobs, len(choice.echo))
            if (echoed := _echoed(gen, choice.index)) is not None:
                logprobs = _logprobs.joined(echoed, logprobs)
        text = choice.echo + "".join(a.parts)
        scores = _prompt_scores(gen, choice.index, scored)
        choices.append(TextChoice(text=text, finish_reason=a.finish, index=choice.index,
                                  logprobs=logprobs, prompt_logprobs=scores,
                                  stop_reason=a.stop))  # fmt: skip
    return TextCompletion(
        id=ident("cmpl", gen),
        created=int(time.time()),
        model=gen.name,
        system_fingerprint=fingerprint(gen.version),
        choices=choices,
        usage=token_usage(gen),
    )


def _echoed(gen: Generation, index: int) -> TextLogprobs | None:
    """The ``logprobs`` of choice ``index``'s echoed prompt, if it was scored (``echo`` with
    ``logprobs``: the alternatives it asked for)."""
    choice = gen.choices[index]
    top, sequence = choice.request.logprobs, choice.request
    if sequence.prompt_logprobs is None or not choice.echo or top is None:
        return None
    return _logprobs.prompt(gen.model, sequence.prompt_ids, choice.prompt_logprobs, top)


def _prompt_scores(
    gen: Generation, index: int, scored: int | None
) -> PromptLogprobs | msgspec.UnsetType:
    """vLLM's ``prompt_logprobs`` of choice ``index``'s prompt, with ``scored`` alternatives
    (``UNSET``, left out, when not asked)."""
    choice = gen.choices[index]
    if scored is None:
        return msgspec.UNSET
    ids = choice.request.prompt_ids
    return _logprobs.vllm_prompt(gen.model, ids, choice.prompt_logprobs, scored)


def _error_event(exc: KilnError) -> bytes:
    return sse(
        ErrorResponse(
            error=ErrorBody(message=exc.message, type=exc.type, param=exc.param, code=exc.code)
        )
    )


def _usage_asked(options: StreamOptions | None) -> tuple[bool, bool]:
    """Whether a stream ends with a usage chunk (``include_usage``), and whether every chunk
    carries the usage so far as well (vLLM's ``continuous_usage_stats``, with it)."""
    if options is None or not options.include_usage:
        return False, False
    return True, bool(options.continuous_usage_stats)


async def stream_chat(
    gen: Generation, options: StreamOptions | None, *, reasoning: bool = True
) -> AsyncGenerator[bytes, None]:
    """``chat.completion.chunk`` events, choices interleaved by ``index``, then usage (if
    asked) and ``[DONE]``; a reasoning model's deltas carry its ``reasoning`` (if
    ``reasoning``) apart from its ``content``."""
    cid, created, model = ident("chatcmpl", gen), int(time.time()), gen.name
    mark, tier = fingerprint(gen.version), gen.admission.service_tier
    include_usage, every = _usage_asked(options)
    splits = {c.index: s for c in gen.choices if (s := splitter(gen, c.index)) is not None}

    usage = functools.partial(token_usage, gen, chat=True, settled={})

    def chunk(piece: Piece, delta: Delta, finish: str | None = None) -> bytes:
        logprobs = None
        if piece.logprobs is not None and finish is None and delta.tool_calls is None:
            logprobs = _logprobs.chat(gen.model, piece.token_ids, piece.logprobs)
        choice = ChunkChoice(delta=delta, finish_reason=finish, index=piece.index,
                             logprobs=logprobs,
                             stop_reason=piece.stop if finish else None)  # fmt: skip
        return sse(ChatCompletionChunk(id=cid, created=created, model=model, choices=[choice],
                                       system_fingerprint=mark, service_tier=tier,
                                       usage=usage() if every else None))  # fmt: skip

    held: dict[int, list[Piece]] = {c.index: [] for c in gen.choices if gen.tools is not None}
    spoke: set[int] = set()
    for choice in gen.choices:
        yield chunk(Piece("", index=choice.index), Delta(role="assistant", content=""))
    try:
        async for arrived in gen.pieces():
            piece, split = arrived, splits.get(arrived.index)
            if piece.index in held:  # tool calls are sent whole, words as they are known
                if split is not None:  # the reasoning is sent as it comes, the answer held
                    thought, piece = _thought(split, piece, reasoning)
                    if thought is not None:
                        yield chunk(arrived, thought)
                events, words = release(gen, held[piece.index], piece, spoke, chunk)
                for event in events:
                    yield event
                if words is None:
                    continue
                piece, split = words, None  # surely words: streamed as they are
            delta = _delta(split, piece, reasoning)
            if delta is not None:
                yield chunk(piece, delta)
            if piece.finish_reason:
                yield chunk(piece, Delta(), piece.finish_reason)
    except KilnError as exc:
        yield _error_event(exc)
    if include_usage:
        last = ChatCompletionChunk(id=cid, created=created, model=model, choices=[],
                                   usage=usage(), system_fingerprint=mark,
                                   service_tier=tier)  # fmt: skip
        yield sse(last)
    yield DONE


def _delta(split: Split | None, piece: Piece, shown: bool) -> Delta | None:
    """The delta a piece makes (``None``: none to send): its text, or a reasoning model's
    content and reasoning (``shown``) made final by it."""
    if split is None:
        return Delta(content=piece.text) if piece.text or piece.logprobs else None
    reasoning, content = split.push(piece.text)
    if piece.finish_reason is not None:
        rest = split.flush()
        reasoning, content = reasoning + rest[0], content + rest[1]
    reasoning = reasoning if shown else ""
    if not (reasoning or content or piece.logprobs):
        return None
    said = reasoning or None
    return Delta(content=content or None, reasoning=said, reasoning_content=said)


def _thought(split: Split, piece: Piece, shown: bool) -> tuple[Delta | None, Piece]:
    """A held piece's reasoning as a delta to send now (``None``: none, or not ``shown``), and
    the piece of its answer left to hold (without the log-probabilities, if the delta takes
    them)."""
    reasoning, content = split.push(piece.text)
    if piece.finish_reason is not None:
        rest = split.flush()
        reasoning, content = reasoning + rest[0], content + rest[1]
    if not (reasoning and shown):
        return None, dataclasses.replace(piece, text=content)
    said = Delta(reasoning=reasoning, reasoning_content=reasoning)
    return said, dataclasses.replace(piece, text=content, token_ids=(), logprobs=None)


async def stream_text(
    gen: Generation, options: StreamOptions | None
) -> AsyncGenerator[bytes, None]:
    """``text_completion`` events, choices interleaved by ``index`` (each opening with its
    ``echo``), then usage (if asked) and ``[DONE]``."""
    cid, created, model = ident("cmpl", gen), int(time.time()), gen.name
    include_usage, every = _usage_asked(options)
    offsets = {choice.index: len(choice.echo) for choice in gen.choices}

    def event(
        index: int, text: str, finish: str | None, logprobs: TextLogprobs | None,
        stop: str | int | None = None,
    ) -> bytes:  # fmt: skip
        choice = TextChoice(text=text, finish_reason=finish, index=index, logprobs=logprobs,
                            stop_reason=stop)  # fmt: skip
        return sse(TextCompletion(id=cid, created=created, model=model, choices=[choice],
                                  usage=token_usage(gen) if every else None))  # fmt: skip

    scored = {c.index for c in gen.choices if c.request.prompt_logprobs is not None}
    for choice in gen.choices:
        if choice.echo and choice.index not in scored:  # a scored one's waits for its scores
            yield event(choice.index, choice.echo, None, None)
    try:
        async for piece in gen.pieces():
            if piece.index in scored:  # its first piece came with the prompt's scores
                scored.discard(piece.index)
                echo = gen.choices[piece.index].echo
                yield event(piece.index, echo, None, _echoed(gen, piece.index))
            if piece.text or piece.finish_reason or piece.logprobs:
                logprobs = None
                if piece.logprobs is not None:
                    start = offsets[piece.index]
                    logprobs = _logprobs.text(gen.model, piece.token_ids, piece.logprobs, start)
                    offsets[piece.index] = start + sum(len(t) for t in logprobs.tokens)
                yield event(piece.index, piece.text, piece.finish_reason, logprobs, piece.stop)
    except KilnError as exc:
        yield _error_event(exc)
    if include_usage:
        yield sse(
            TextCompletion(id=cid, created=created, model=model, choices=[], usage=token_usage(gen))
        )
    yield DONE
