"""The worker's per-token log-probabilities in OpenAI's two shapes (chat and legacy text)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from msgspec.structs import replace

from kiln_platform.gateway.llm_schemas import (
    ChoiceLogprobs,
    PromptLogprob,
    PromptLogprobs,
    TextLogprobs,
    TokenLogprob,
    TopLogprob,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from kiln_platform.gateway._textmodel import TextModel
    from kiln_runtimes.protocol import TokenLogprobs


def _text(model: TextModel, token_id: int) -> tuple[str, bytes]:
    raw = model.token_bytes(token_id)
    return raw.decode("utf-8", errors="replace"), raw


def _token(model: TextModel, token_id: int, entry: TokenLogprobs) -> TokenLogprob:
    text, raw = _text(model, token_id)
    tops = []
    for alt, logprob in zip(entry.top_ids, entry.top_logprobs, strict=True):
        alt_text, alt_raw = _text(model, alt)
        tops.append(TopLogprob(token=alt_text, logprob=logprob, bytes_=list(alt_raw)))
    return TokenLogprob(token=text, logprob=entry.logprob, bytes_=list(raw), top_logprobs=tops)


def chat(
    model: TextModel, token_ids: Sequence[int], entries: Sequence[TokenLogprobs]
) -> ChoiceLogprobs:
    """``choices[i].logprobs`` of a chat completion (or of one stream chunk)."""
    return ChoiceLogprobs(
        content=[_token(model, t, e) for t, e in zip(token_ids, entries, strict=True)]
    )


def text(
    model: TextModel, token_ids: Sequence[int], entries: Sequence[TokenLogprobs], offset: int
) -> TextLogprobs:
    """``choices[i].logprobs`` of a text completion; offsets count characters from ``offset``."""
    tokens, offsets = [], []
    tops: list[dict[str, float] | None] = []
    for token_id, entry in zip(token_ids, entries, strict=True):
        piece = _text(model, token_id)[0]
        tokens.append(piece)
        offsets.append(offset)
        offset += len(piece)
        pairs = zip(entry.top_ids, entry.top_logprobs, strict=True)
        top = {_text(model, alt)[0]: lp for alt, lp in pairs}
        top.setdefault(piece, entry.logprob)
        tops.append(top)
    return TextLogprobs(
        tokens=tokens,
        token_logprobs=[e.logprob for e in entries],
        top_logprobs=tops,
        text_offset=offsets,
    )


def prompt(
    model: TextModel, token_ids: Sequence[int], entries: Sequence[TokenLogprobs], top: int
) -> TextLogprobs:
    """The echoed prompt's ``logprobs``: its first token has none (nothing came before it);
    ``entries`` score the tokens after it, ``top`` alternatives of theirs shown."""
    first = _text(model, token_ids[0])[0]
    shown = [replace(e, top_ids=e.top_ids[:top], top_logprobs=e.top_logprobs[:top])
             for e in entries]  # fmt: skip
    rest = text(model, token_ids[1 : 1 + len(entries)], shown, len(first))
    return TextLogprobs(
        tokens=[first, *rest.tokens],
        token_logprobs=[None, *rest.token_logprobs],
        top_logprobs=[None, *(rest.top_logprobs or [])],
        text_offset=[0, *rest.text_offset],
    )


def vllm_prompt(
    model: TextModel, token_ids: Sequence[int], entries: Sequence[TokenLogprobs], top: int
) -> PromptLogprobs:
    """vLLM's ``prompt_logprobs``: ``None`` for the first token, then for each the token
    itself (with its rank) and its ``top`` alternatives (ranks from 1), by token id."""
    out: PromptLogprobs = [None]
    for token, entry in zip(token_ids[1:], entries, strict=False):
        ranked = [(token, entry.logprob, entry.rank)]
        pairs = zip(entry.top_ids[:top], entry.top_logprobs[:top], strict=True)
        ranked += [(alt, logprob, rank) for rank, (alt, logprob) in enumerate(pairs, 1)]
        position: dict[str, PromptLogprob] = {}
        for token_id, logprob, rank in ranked:
            decoded = _text(model, token_id)[0]
            scored = PromptLogprob(logprob=logprob, rank=rank, decoded_token=decoded)
            position.setdefault(str(token_id), scored)
        out.append(position)
    return out


def joined(first: TextLogprobs, then: TextLogprobs) -> TextLogprobs:
    """Two runs of tokens' ``logprobs`` as one (the echoed prompt's, then the answer's)."""
    return TextLogprobs(
        tokens=first.tokens + then.tokens,
        token_logprobs=first.token_logprobs + then.token_logprobs,
        top_logprobs=(first.top_logprobs or []) + (then.top_logprobs or []),
        text_offset=first.text_offset + then.text_offset,
    )
