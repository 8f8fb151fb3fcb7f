"""A response's objects: the ``response`` as it starts and as it ends, and its output items —
the function calls it made, or its message after a reasoning model's reasoning item (what it
wrote between ``<think>`` tags, ``gateway._reasoning``)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from kiln_platform.gateway import _logprobs
from kiln_platform.gateway._chat_calls import ident, tool_calls
from kiln_platform.gateway.completions import splitter
from kiln_platform.gateway.conversation_items import named
from kiln_platform.gateway.llm_usage import spent
from kiln_platform.gateway.responses_schemas import (
    FunctionCallItem,
    IncompleteDetails,
    InputTokensDetails,
    OutputMessage,
    OutputText,
    OutputTokensDetails,
    ReasoningItem,
    ReasoningText,
    ResponseObject,
    ResponsesRequest,
    ResponseUsage,
)
from kiln_platform.registry.lifecycle import fingerprint

if TYPE_CHECKING:
    from kiln_platform.gateway._reasoning import Split
    from kiln_platform.gateway.completions import Answer
    from kiln_platform.gateway.llm import Generation
    from kiln_platform.gateway.llm_schemas import TokenLogprob

Item = ReasoningItem | OutputMessage | FunctionCallItem


def response(
    gen: Generation, request: ResponsesRequest, created: int, **fields: Any
) -> ResponseObject:
    """The response object of ``gen`` (``in_progress`` and empty unless ``fields`` say)."""
    return ResponseObject(
        id=ident("resp", gen), created_at=created, model=gen.name,
        instructions=request.instructions, max_output_tokens=request.max_output_tokens,
        temperature=1.0 if request.temperature is None else request.temperature,
        top_p=1.0 if request.top_p is None else request.top_p, user=request.user,
        metadata=request.metadata or {}, system_fingerprint=fingerprint(gen.version),
        service_tier=gen.admission.service_tier,
        text=request.text or {"format": {"type": "text"}}, tools=request.tools or [],
        tool_choice=request.tool_choice or "auto", store=bool(request.store),
        parallel_tool_calls=request.parallel_tool_calls is not False,
        truncation=request.truncation or "disabled", reasoning=request.reasoning,
        previous_response_id=request.previous_response_id, background=bool(request.background),
        conversation=named(request.conversation),
        **{"status": "in_progress", "output": [], "usage": None, **fields},
    )  # fmt: skip


def scored(gen: Generation, answer: Answer, start: int) -> list[TokenLogprob]:
    """The answer's log-probabilities from token ``start`` on (none unless asked)."""
    if not answer.logprobs:
        return []
    ids, entries = answer.token_ids[start:], answer.logprobs[start:]
    return _logprobs.chat(gen.model, ids, entries).content or []


def reasoned(gen: Generation, split: Split | None) -> int:
    """How many of the answer's tokens so far were its reasoning (``_reasoning``)."""
    return spent(gen, 0) if split is not None else 0


def output(gen: Generation, answer: Answer, status: str) -> tuple[list[Item], int]:
    """The answer's output items, and how many of its tokens were reasoning: its reasoning
    item (if it wrote any reasoning), then its calls, if the request's tools were called, else
    its message (unless it wrote nothing after its reasoning), with its log-probabilities if
    asked."""
    text, split = "".join(answer.parts), splitter(gen, 0)
    thought, content = ("", text) if split is None else split.whole(text)
    items: list[Item] = []
    if thought:
        closed = "completed" if split is not None and split.state == "after" else status
        items.append(ReasoningItem(id=ident("rs", gen), content=[ReasoningText(text=thought)],
                                   status=closed))  # fmt: skip
    spent = reasoned(gen, split)
    if (calls := tool_calls(gen, 0, content, answer.finish)) is not None and gen.tools:
        if words := gen.tools.preface(content):  # the words before the calls: no log-probs
            items.append(OutputMessage(id=ident("msg", gen), status=status,
                                       content=[OutputText(text=words)]))  # fmt: skip
        return [*items, *(
            FunctionCallItem(id=f"fc-{c.id}", call_id=c.id, name=c.function.name,
                             arguments=c.function.arguments) for c in calls
        )], spent  # fmt: skip
    if content or not thought:
        said = OutputText(text=content, logprobs=scored(gen, answer, spent))
        items.append(OutputMessage(id=ident("msg", gen), status=status, content=[said]))
    return items, spent


def answered(
    gen: Generation, request: ResponsesRequest, created: int, answer: Answer
) -> ResponseObject:
    """The finished response: ``completed``, or ``incomplete`` if cut at the token limit."""
    status = "completed" if answer.finish == "stop" else "incomplete"
    items, spent = output(gen, answer, status)
    prompt, completion, total = gen.usage_counts()
    usage = ResponseUsage(
        input_tokens=prompt, output_tokens=completion, total_tokens=total,
        input_tokens_details=InputTokensDetails(cached_tokens=gen.cached_tokens),
        output_tokens_details=OutputTokensDetails(reasoning_tokens=spent),
    )  # fmt: skip
    details = None if status == "completed" else IncompleteDetails(reason="max_output_tokens")
    return response(
        gen, request, created, status=status, output=items, usage=usage,
        incomplete_details=details, completed_at=int(time.time()),
    )  # fmt: skip
