"""The GenAI backend on the real SmolLM2-135M-Instruct folder (built once, then cached).

Set ``KILN_TEST_SMOLLM2_DIR`` to a built folder to skip the build; otherwise it is built into
``<model cache>/smollm2-<version>-int8`` (``~/.cache/kiln-test`` unless ``KILN_TEST_CACHE`` says
otherwise), the folder the e2e tests use.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
import pytest

from kiln_runtimes.protocol import GenerateChunk, GenerateRequest

from .chat import ChatPrompt, start_backend

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from kiln_runtimes.backends.genai import GenAIGenerationBackend

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

MAX_SEQUENCES = 8


@pytest.fixture(scope="module")
async def backend(smollm2_dir: Path) -> AsyncIterator[GenAIGenerationBackend]:
    from kiln_runtimes.backends.base import EngineOptions

    generation = await start_backend(smollm2_dir, EngineOptions(max_batch_size=MAX_SEQUENCES))
    yield generation
    generation.unload()


@pytest.fixture(scope="module")
def chat(smollm2_dir: Path) -> ChatPrompt:
    return ChatPrompt(smollm2_dir)


def greedy(rid: str, prompt: list[int], max_tokens: int = 48, **sampling: float) -> GenerateRequest:
    options = {"temperature": 0.0, **sampling}
    return GenerateRequest(request_id=rid, prompt_ids=prompt, max_tokens=max_tokens, **options)  # type: ignore[arg-type]


async def generate(
    backend: GenAIGenerationBackend, request: GenerateRequest
) -> tuple[list[int], GenerateChunk]:
    tokens: list[int] = []
    async for chunk in backend.stream(request):
        tokens += chunk.token_ids
    return tokens, chunk


async def test_greedy_answer_is_the_source_models(
    backend: GenAIGenerationBackend, chat: ChatPrompt
) -> None:
    """transformers, greedy on the source weights (the GGUF dequantized to fp32), answers this
    question with exactly this sentence, and its top-2 logit gap is at least 0.86 at every
    token: a build that reads like its source gives the same answer. (The bare "What is the
    capital of France?" is a near-tie in the source itself: "The" 25.325 vs "L" 25.243, so any
    re-quantization may open with "L'Étoile...".)"""
    prompt = chat.ids("What is the capital of France? Answer in one sentence.")
    tokens, last = await generate(backend, greedy("paris", prompt))
    assert chat.text(tokens) == "The capital of France is Paris."
    assert last.prompt_tokens == len(prompt)
    assert last.completion_tokens >= len(tokens)


async def test_greedy_and_seeded_sampling_are_repeatable(
    backend: GenAIGenerationBackend, chat: ChatPrompt
) -> None:
    prompt = chat.ids("Write a sentence about the sea.")
    first, _ = await generate(backend, greedy("g1", prompt, 24))
    again, _ = await generate(backend, greedy("g2", prompt, 24))
    assert first == again
    seeded = greedy("s", prompt, 24, temperature=0.9, top_p=0.9)
    one, _ = await generate(backend, msgspec.structs.replace(seeded, seed=7))
    two, _ = await generate(backend, msgspec.structs.replace(seeded, seed=7))
    assert one == two


async def test_max_tokens_finishes_with_length(
    backend: GenAIGenerationBackend, chat: ChatPrompt
) -> None:
    tokens, last = await generate(backend, greedy("len", chat.ids("Tell me a long story."), 5))
    assert len(tokens) == 5
    assert (last.finish_reason, last.completion_tokens) == ("length", 5)


async def test_concurrent_streams_match_solo_runs(
    backend: GenAIGenerationBackend, chat: ChatPrompt
) -> None:
    questions = [f"Name a fruit that is {color}." for color in ("red", "yellow", "green", "blue")]
    prompts = [chat.ids(q) for q in questions * 2]
    solo = [await generate(backend, greedy(f"solo{i}", p, 24)) for i, p in enumerate(prompts[:4])]
    together = await asyncio.gather(
        *(generate(backend, greedy(f"c{i}", p, 24)) for i, p in enumerate(prompts))
    )
    assert len(together) == MAX_SEQUENCES
    assert all(last.finish_reason in ("stop", "length") for _, last in together)
    assert [tokens for tokens, _ in together] == [tokens for tokens, _ in solo] * 2
    assert (backend.health().running, backend.health().waiting) == (0, 0)


async def test_closing_a_stream_frees_its_slot_within_a_second(
    backend: GenAIGenerationBackend, chat: ChatPrompt
) -> None:
    prompt = chat.ids("Tell me a long story about a dragon.")
    long = greedy("long", prompt, 1000, temperature=1.0, seed=3)  # sampling: no early EOS stop
    others = [asyncio.create_task(generate(backend, long)) for _ in range(3)]
    stream = backend.stream(long)
    await anext(stream)
    assert await poll(lambda: backend.health().running == 4, 5.0)
    await stream.aclose()
    assert await poll(lambda: backend.health().running == 3, 1.0), "the closed stream kept its slot"
    for task in others:
        task.cancel()
    await asyncio.gather(*others, return_exceptions=True)
    assert await poll(lambda: backend.health().running == 0, 1.0)


async def poll(condition: Callable[[], bool], seconds: float) -> bool:
    """Whether ``condition()`` comes true within ``seconds``."""
    for _ in range(int(seconds / 0.005)):
        if condition():
            return True
        await asyncio.sleep(0.005)
    return condition()
