"""LoRA adapters on the real SmolLM2 graph: loaded on demand from the artifact store into two
slots, rows of different adapters (and of none) in the same steps, each as if it ran alone."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from kiln_runtimes.lora import Dims
from kiln_runtimes.protocol import GenerateRequest, TokenLogprobs
from kiln_runtimes.store import ArtifactStore

from .chat import start_backend

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from kiln_runtimes.backends.genai import GenAIGenerationBackend

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

QV = ("q_proj", "v_proj")


@pytest.fixture(scope="module")
def prompt(smollm2_dir: Path) -> list[int]:
    """A chat question, so the base model's answer is clear (greedy ties are rare)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(smollm2_dir / "tokenizer.json"))
    text = "<|im_start|>user\nName three colours of the rainbow.<|im_end|>\n<|im_start|>assistant\n"
    return list(tokenizer.encode(text, add_special_tokens=False).ids)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> ArtifactStore:
    return ArtifactStore(tmp_path_factory.mktemp("store"))


@pytest.fixture(scope="module")
def adapters(
    store: ArtifactStore, smollm2_dir: Path, peft: Any, tmp_path_factory: Any
) -> dict[str, str]:
    """Adapter name -> digest in ``store``: made-up weights in PEFT's files."""
    dims = Dims.from_genai_config(json.loads((smollm2_dir / "genai_config.json").read_text()))
    folders = tmp_path_factory.mktemp("adapters")
    made = {
        "zero": (8, QV, {"zero_b": True}),
        "qv": (8, QV, {}),
        "o": (16, ("o_proj",), {}),
        "qkv": (4, ("q_proj", "k_proj", "v_proj"), {}),
    }
    digests = {}
    for seed, (name, (rank, modules, extra)) in enumerate(made.items()):
        weights = peft.tensors(dims, rank, modules, seed=seed, scale=0.05, **extra)
        digests[name] = store.put_dir(
            peft.write(folders / name, peft.config(rank, modules), weights)
        )
    wrong = Dims(num_layers=dims.num_layers, hidden=64, q_size=dims.q_size, kv_size=dims.kv_size)
    bad = peft.write(folders / "bad", peft.config(8, QV), peft.tensors(wrong, 8, QV, seed=9))
    digests["bad"] = store.put_dir(bad)
    return digests


@pytest.fixture(scope="module")
async def backend(store: ArtifactStore, smollm2_dir: Path) -> AsyncIterator[GenAIGenerationBackend]:
    from kiln_runtimes.backends.base import EngineOptions

    folder = store.path(store.put_dir(smollm2_dir))  # adapters come from the model's store
    options = EngineOptions(max_batch_size=4, adapter_slots=2, adapter_rank=16)
    generation = await start_backend(folder, options)
    yield generation
    generation.unload()


NEAR_TIE = 0.45
"""Log-probability slack of an adapter row batched against its solo run. The LoRA path's fp32
MatMul sums in another order for 4 rows than for 1 (~5e-6 apart), and the int8 graph's
quantized activations can turn that into a different rounding: up to 0.19 apart on 16 tokens
here, 0.33 in one CI run (docs/architecture.md, "LoRA adapters"). That is about as far as
these adapters are from one another (``qv`` and ``o`` 0.02-0.42 on their shared first ten
tokens), so a row is also checked to be nearer its own solo run than any other's
(``nearest``). Rows without an adapter stay bit-identical."""


async def generate(
    backend: GenAIGenerationBackend, prompt: list[int], rid: str, adapter: str | None = None
) -> list[int]:
    return [token for token, _ in await scored(backend, prompt, rid, adapter)]


async def scored(
    backend: GenAIGenerationBackend, prompt: list[int], rid: str, adapter: str | None = None
) -> list[tuple[int, TokenLogprobs]]:
    """Greedy tokens, each with its log-probability and the top two."""
    request = GenerateRequest(
        request_id=rid, prompt_ids=prompt, max_tokens=16, temperature=0.0, adapter=adapter,
        logprobs=2,
    )  # fmt: skip
    return [
        pair
        async for chunk in backend.stream(request)
        for pair in zip(chunk.token_ids, chunk.logprobs or [], strict=True)
    ]


def assert_same_run(
    batched: list[tuple[int, TokenLogprobs]], solo: list[tuple[int, TokenLogprobs]]
) -> None:
    """Equal tokens with log-probabilities within ``NEAR_TIE``, up to a token where the solo
    run's top two were within ``NEAR_TIE`` and the batched run took the other (then the texts
    differ by arithmetic, not by a mixed-up adapter, and nothing after can be compared)."""
    for (token, scores), (alone, alone_scores) in zip(batched, solo, strict=False):
        if token != alone:
            top, second = alone_scores.top_logprobs
            assert top - second <= NEAR_TIE, (token, alone_scores)
            assert token == alone_scores.top_ids[1], (token, alone_scores)
            return
        assert abs(scores.logprob - alone_scores.logprob) <= NEAR_TIE, (token, scores, alone_scores)
    assert len(batched) == len(solo)


def _common(a: list[tuple[int, TokenLogprobs]], b: list[tuple[int, TokenLogprobs]]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x[0] != y[0]),
                min(len(a), len(b)))  # fmt: skip


def nearest(
    batched: list[tuple[int, TokenLogprobs]], solos: dict[str, list[tuple[int, TokenLogprobs]]],
    own: str,
) -> str:  # fmt: skip
    """The solo run ``batched`` is nearest over the tokens it shares with its ``own`` solo run:
    the most of them in common, then the least mean log-probability gap (a mixed-up adapter is
    nearer another adapter's run). Past them a near tie went the other way (``assert_same_run``),
    and another adapter's run may happen to share the token taken: that says nothing."""
    upto = _common(batched, solos[own])

    def distance(solo: list[tuple[int, TokenLogprobs]]) -> tuple[int, float]:
        shared = min(_common(batched, solo), upto)
        gaps = [
            abs(b[1].logprob - s[1].logprob) for b, s in zip(batched[:shared], solo, strict=False)
        ]
        return -shared, sum(gaps) / max(shared, 1)

    return min(solos, key=lambda name: distance(solos[name]))


async def test_an_adapter_with_zero_b_generates_what_the_base_model_does(
    backend: GenAIGenerationBackend, adapters: dict[str, str], prompt: list[int]
) -> None:
    assert await generate(backend, prompt, "z", adapters["zero"]) == await generate(
        backend, prompt, "base"
    )


async def test_adapters_change_the_output_repeatably(
    backend: GenAIGenerationBackend, adapters: dict[str, str], prompt: list[int]
) -> None:
    base = await generate(backend, prompt, "base")
    for name in ("qv", "o", "qkv"):
        first = await generate(backend, prompt, f"{name}1", adapters[name])
        assert first != base, name
        assert await generate(backend, prompt, f"{name}2", adapters[name]) == first


async def test_rows_of_three_adapters_and_none_in_two_slots_match_their_solo_runs(
    backend: GenAIGenerationBackend, adapters: dict[str, str], prompt: list[int]
) -> None:
    names: list[str | None] = [None, "qv", "o", "qkv", "qv", None]
    solo = [
        await scored(backend, prompt, f"solo{i}", name and adapters[name])
        for i, name in enumerate(names)
    ]
    together = await asyncio.gather(
        *(
            scored(backend, prompt, f"mix{i}", name and adapters[name])
            for i, name in enumerate(names)
        )
    )
    solos = {str(name): run for name, run in zip(names, solo, strict=True)}
    for name, batched, alone in zip(names, together, solo, strict=True):
        if name is None:
            assert batched == alone  # no adapter: bit for bit
        else:
            assert_same_run(batched, alone)
            assert nearest(batched, solos, name) == name
    health = backend.health()
    assert (health.running, health.waiting) == (0, 0)
    in_slots, in_memory = health.adapters_in_slots, health.adapters_in_memory
    assert (in_slots, in_memory >= 3) == (2, True)  # qv, o, qkv read once; two slots in use


async def test_an_adapter_that_does_not_fit_the_model_is_refused_before_admission(
    backend: GenAIGenerationBackend, adapters: dict[str, str], prompt: list[int]
) -> None:
    with pytest.raises(ValueError, match="this model needs"):
        await generate(backend, prompt, "bad", adapters["bad"])
    with pytest.raises(ValueError, match="not in this worker's artifact store"):
        await generate(backend, prompt, "missing", "sha256:" + "0" * 64)
    assert await generate(backend, prompt, "after") == await generate(backend, prompt, "base")
