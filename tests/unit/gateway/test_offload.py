"""Tokenizing off the event loop: small text stays on the loop (the hot path), large text goes
to a thread and the loop keeps serving meanwhile (a real tokenizer built in the test)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from kiln_platform.gateway._offload import INLINE_CHARS, off_loop
from kiln_platform.gateway._textmodel import TextModel


@pytest.fixture(scope="module")
def model() -> TextModel:
    """A byte-level BPE with single-byte tokens and no template."""
    vocab = {c: i for i, c in enumerate(pre_tokenizers.ByteLevel.alphabet())}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    return TextModel(tok, None, "", "", ())


async def test_small_text_stays_on_the_loop_large_text_does_not() -> None:
    loop_thread = threading.get_ident()
    assert await off_loop(INLINE_CHARS, threading.get_ident) == loop_thread
    assert await off_loop(INLINE_CHARS + 1, threading.get_ident) != loop_thread


def test_encode_gives_the_tokenizers_ids(model: TextModel) -> None:
    text = "Café 🚀 naïve 日本語 <|im_end|> done"
    assert model.encode(text) == model.tokenizer.encode(text, add_special_tokens=False).ids


async def test_a_long_prompt_leaves_the_loop_running(model: TextModel) -> None:
    text = "the scheduler keeps one queue per pool " * 50_000  # 2 MB
    start = time.perf_counter()
    expected = model.encode(text)
    inline = time.perf_counter() - start
    assert inline > 0.1, "too fast to show a stall on this machine"
    worst, running = 0.0, True

    async def tick() -> None:
        nonlocal worst
        last = time.perf_counter()
        while running:
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            worst, last = max(worst, now - last), now

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0.01)
    assert await off_loop(len(text), model.encode, text) == expected
    running = False
    await ticker
    assert worst < inline / 4, f"the loop stalled {worst * 1000:.0f} ms of {inline * 1000:.0f}"
