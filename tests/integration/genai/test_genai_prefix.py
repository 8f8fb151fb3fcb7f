"""The prefix cache on the real SmolLM2 graph: greedy output is token for token what the backend
gives without the cache, a second request reuses the blocks of the first, and one tenant's blocks
are never another's unless they lie in the request's public prefix."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from kiln_runtimes.protocol import GenerateRequest

from .chat import ChatPrompt, start_backend

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from kiln_runtimes.backends.base import PrefixStats
    from kiln_runtimes.backends.genai import GenAIGenerationBackend

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SYSTEM = (
    "You are Kiln's support assistant. Answer briefly and politely. Kiln serves embedding, "
    "tensor and chat models to many tenants; each tenant has keys, quotas and a bill. "
) * 8  # about 300 tokens with the template: two whole 128-token blocks


async def _backend(folder: Path, cache_bytes: int) -> GenAIGenerationBackend:
    from kiln_runtimes.backends.base import EngineOptions

    return await start_backend(
        folder, EngineOptions(max_batch_size=2, prefix_cache_bytes=cache_bytes)
    )


@pytest.fixture(scope="module")
async def cached(smollm2_dir: Path) -> AsyncIterator[GenAIGenerationBackend]:
    generation = await _backend(smollm2_dir, 64 << 20)
    yield generation
    generation.unload()


@pytest.fixture(scope="module")
async def uncached(smollm2_dir: Path) -> AsyncIterator[GenAIGenerationBackend]:
    generation = await _backend(smollm2_dir, 0)
    yield generation
    generation.unload()


@pytest.fixture(scope="module")
def prompt(smollm2_dir: Path) -> ChatPrompt:
    return ChatPrompt(smollm2_dir, system=SYSTEM)


async def generate(
    backend: GenAIGenerationBackend, prompt: list[int], tenant: str = "t", public: int = 0
) -> list[int]:
    request = GenerateRequest(
        request_id=f"r{id(prompt)}", prompt_ids=prompt, max_tokens=32, temperature=0.0,
        stop_token_ids=[], tenant=tenant, public_prefix=public,
    )  # fmt: skip
    tokens: list[int] = []
    async for chunk in backend.stream(request):
        tokens += chunk.token_ids
    return tokens


def stats(backend: GenAIGenerationBackend) -> PrefixStats:
    found = backend.health().prefix_cache
    assert found is not None
    return found


async def test_greedy_output_is_the_same_with_the_cache_and_the_second_request_hits(
    cached: GenAIGenerationBackend, uncached: GenAIGenerationBackend, prompt: ChatPrompt
) -> None:
    assert uncached.health().prefix_cache is None
    first, second = prompt.ids("How do I rotate a key?"), prompt.ids("What does a token cost?")
    assert len(first) > 2 * 128
    expected = [await generate(uncached, ids) for ids in (first, second)]
    before = stats(cached)
    assert await generate(cached, first) == expected[0]  # nothing cached yet
    after_first = stats(cached)
    assert after_first.hit_blocks == before.hit_blocks
    assert after_first.blocks >= before.blocks + 2
    assert await generate(cached, second) == expected[1]  # the system prompt's blocks reused
    assert await generate(cached, first) == expected[0]  # and every block of the first prompt
    assert stats(cached).hit_blocks >= after_first.hit_blocks + 4


async def test_a_tenant_never_reuses_another_tenants_blocks_outside_the_public_prefix(
    cached: GenAIGenerationBackend, uncached: GenAIGenerationBackend, prompt: ChatPrompt
) -> None:
    ids = prompt.ids("Where is my bill?")
    expected = await generate(uncached, ids)
    assert await generate(cached, ids, tenant="alice") == expected
    hits = stats(cached).hit_blocks
    assert await generate(cached, ids, tenant="bob") == expected
    assert stats(cached).hit_blocks == hits  # same tokens, other tenant: nothing reused
    public = 128  # the first block (inside the system prompt) is public, the second is not
    assert await generate(cached, ids, tenant="carol", public=public) == expected
    hits = stats(cached).hit_blocks
    assert await generate(cached, ids, tenant="dave", public=public) == expected
    assert stats(cached).hit_blocks == hits + 1  # the public block, not carol's own
