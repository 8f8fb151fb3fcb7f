"""A generation's token usage as OpenAI reports it: prompt, completion (a chat's reasoning
tokens apart, ``completion_tokens_details``) and the prompt tokens the prefix cache held."""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from kiln_platform.gateway._harmony import analysis_tokens
from kiln_platform.gateway._reasoning import reasoning_tokens
from kiln_platform.gateway.llm_schemas import (
    CompletionTokensDetails,
    PromptTokensDetails,
    Usage,
)

if TYPE_CHECKING:
    from kiln_platform.gateway.llm import Generation


def token_usage(
    gen: Generation, *, chat: bool = False, settled: dict[int, int] | None = None
) -> Usage:
    """The usage so far (a chat's with its reasoning tokens, as OpenAI's); a stream that asks
    each chunk passes the same ``settled`` (``spent``)."""
    prompt, completion, total = gen.usage_counts()
    details: CompletionTokensDetails | msgspec.UnsetType = msgspec.UNSET
    if chat:
        reasoning = sum(spent(gen, index, settled) for index in range(len(gen.choices)))
        details = CompletionTokensDetails(reasoning_tokens=reasoning)
    return Usage(
        prompt_tokens=prompt, completion_tokens=completion, total_tokens=total,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=gen.cached_tokens),
        completion_tokens_details=details,
    )  # fmt: skip


def spent(gen: Generation, index: int, settled: dict[int, int] | None = None) -> int:
    """How many of choice ``index``'s tokens so far were its reasoning (none unless its model
    reasons in tags and it is a chat's, whose tokens are kept). A count no later token can
    change (the reasoning closed, or text came first) is kept in ``settled``, so a stream's
    count per chunk does not read the prompt and the answer again each time."""
    if settled is not None and index in settled:
        return settled[index]
    think, choice = gen.model.think, gen.choices[index]
    tokens, tokenizer, harmony = choice.tokens, gen.model.tokenizer, gen.model.harmony
    if tokens is not None and harmony is not None:  # gpt-oss's channels
        count, done = analysis_tokens(tokens, harmony, tokenizer)
        if settled is not None and done:
            settled[index] = count
        return count
    if think is None or tokens is None:
        return 0
    count = reasoning_tokens(think, choice.request.prompt_ids, tokens, tokenizer)
    closed = count > 0 and tokens[count - 1] == think.close_id
    if settled is not None and (closed or (not count and tokenizer.decode(list(tokens)).strip())):
        settled[index] = count
    return count
