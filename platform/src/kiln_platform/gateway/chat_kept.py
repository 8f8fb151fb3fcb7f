"""``store: true`` on ``/v1/chat/completions``: the answer, streamed or not, kept with the
messages it answered and the request's metadata (``gateway.chat_store``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec
import structlog
from sqlalchemy.exc import SQLAlchemyError

from kiln_platform.gateway import metrics
from kiln_platform.gateway.completions import DONE
from kiln_platform.gateway.conversation_items import metadata_of
from kiln_platform.gateway.llm_schemas import (
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChoiceLogprobs,
    TokenLogprob,
    ToolCall,
    Usage,
)
from kiln_platform.gateway.llm_usage import token_usage

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator

    from kiln_platform.gateway.llm import Generation
    from kiln_platform.gateway.llm_schemas import ChatCompletionRequest

log = structlog.get_logger(__name__)


async def keep(gen: Generation, request: ChatCompletionRequest, completion: ChatCompletion) -> None:
    """Store ``completion`` if the request asked. It is made and billed by now, so a database
    that does not take it is logged and counted, and the answer sent all the same."""
    if not request.keep:
        return
    body = msgspec.to_builtins(completion) | {"metadata": metadata_of(request.metadata)}
    messages = msgspec.to_builtins(request.messages)
    try:
        await gen.kiln.chats.save(gen.admission.principal.tenant_id, body, messages)
    except (SQLAlchemyError, OSError):
        log.warning("chat completion not stored", completion_id=completion.id, exc_info=True)
        metrics.CHATS_NOT_STORED.labels(gen.name).inc()


async def recorded(
    gen: Generation, request: ChatCompletionRequest, events: AsyncGenerator[bytes, None]
) -> AsyncGenerator[bytes, None]:
    """``events`` (``completions.stream_chat``'s), the completion they make up stored before
    ``[DONE]``, so a client that read the end finds it; one that ended in an error is not."""
    chunks: list[ChatCompletionChunk] = []
    failed = False
    async for event in events:
        if event == DONE and not failed and chunks:
            await keep(gen, request, assembled(chunks, token_usage(gen, chat=True)))
        elif event != DONE:
            try:
                chunks.append(msgspec.json.decode(event[6:], type=ChatCompletionChunk))
            except msgspec.ValidationError:  # an error event
                failed = True
        yield event


def assembled(chunks: list[ChatCompletionChunk], usage: Usage) -> ChatCompletion:
    """The ``chat.completion`` a stream's chunks make up (as a client joins them), ``usage``'s."""
    texts: dict[int, list[str]] = {}
    thoughts: dict[int, list[str]] = {}
    calls: dict[int, list[ToolCall]] = {}
    logprobs: dict[int, list[TokenLogprob]] = {}
    finish: dict[int, str] = {}
    stops: dict[int, str | int | None] = {}
    for chunk in chunks:
        for c in chunk.choices:
            texts.setdefault(c.index, []).append(c.delta.content or "")
            if c.delta.reasoning:
                thoughts.setdefault(c.index, []).append(c.delta.reasoning)
            for call in c.delta.tool_calls or []:
                calls.setdefault(c.index, []).append(ToolCall(id=call.id, function=call.function))
            if c.logprobs is not None and c.logprobs.content is not None:
                logprobs.setdefault(c.index, []).extend(c.logprobs.content)
            if c.finish_reason is not None:
                finish[c.index], stops[c.index] = c.finish_reason, c.stop_reason
    choices = [
        ChatChoice(
            index=i,
            message=AssistantMessage.reasoned(
                None if i in calls else "".join(parts), "".join(thoughts.get(i, ())),
                tool_calls=calls.get(i)),
            finish_reason=finish.get(i, "stop"), stop_reason=stops.get(i),
            logprobs=ChoiceLogprobs(content=logprobs[i]) if i in logprobs else None,
        )
        for i, parts in sorted(texts.items())
    ]  # fmt: skip
    first = chunks[0]
    return ChatCompletion(
        id=first.id, created=first.created, model=first.model, choices=choices,
        usage=usage, system_fingerprint=first.system_fingerprint,
        service_tier=first.service_tier,
    )  # fmt: skip
