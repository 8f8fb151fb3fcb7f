"""A chat's reasoning tokens counted as its answer grows: a stream that asks every chunk
(``continuous_usage_stats``) gets the counts a fresh count gives, and keeps those no later
token changes so it does not read the prompt and the answer again each time."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from kiln_platform.gateway._reasoning import Think
from kiln_platform.gateway.llm_usage import spent

OPEN, CLOSE = 7, 8
TEXT = {OPEN: "<think>", CLOSE: "</think>", 4: "a", 5: "b", 6: "c", 9: "\n"}


def _gen(prompt: list[int], tokens: list[int]) -> Any:
    tokenizer = SimpleNamespace(decode=lambda ids: "".join(TEXT[t] for t in ids))
    choice = SimpleNamespace(request=SimpleNamespace(prompt_ids=prompt), tokens=tokens)
    model = SimpleNamespace(think=Think(OPEN, CLOSE), harmony=None, tokenizer=tokenizer)
    return SimpleNamespace(model=model, choices=[choice])


@pytest.mark.parametrize(
    ("prompt", "answer", "settles_at"),
    [
        ([1, OPEN], [4, 5, CLOSE, 6, 4], 3),  # settles once it closed
        ([1], [9, 9, OPEN, 4, CLOSE, 6], 5),  # blank space first: not settled before the close
        ([1], [9, 4, OPEN, 5, CLOSE], 2),  # text first: none, settled at the text
        ([1, OPEN], [4, 5, 6], None),  # never closed: counted afresh every time
    ],
)
def test_a_streams_counts_are_fresh_counts_and_settle_when_final(
    prompt: list[int], answer: list[int], settles_at: int | None
) -> None:
    tokens: list[int] = []
    gen, settled = _gen(prompt, tokens), dict[int, int]()
    for at, token in enumerate(answer, 1):
        tokens.append(token)
        fresh = spent(_gen(prompt, list(tokens)), 0)
        assert spent(gen, 0, settled) == fresh
        assert (0 in settled) is (settles_at is not None and at >= settles_at)
    if settles_at is not None:  # a settled count is not read again
        gen.choices[0].request.prompt_ids = None
        assert spent(gen, 0, settled) == settled[0]
