"""The prefix cache on a shared system prompt: closed-loop streams through Kiln's GenAI backend
(no HTTP, no gateway), the cache off then on in each round of the same run.

    python bench/prefix_cache.py MODEL_DIR [--streams 16] [--system 600] [--max-tokens 64]
        [--requests 4] [--rounds 2] [--cache-mb 256] [--threads 0] [--no-spin]

Every request is the chat template around one ``--system``-token system prompt (the same for
all) and a short question of its own (request ``i`` asks question ``i``), greedy, one tenant.
Each stream sends its next request when the last one ends, ``--requests`` in all. Per mode: TTFT
(submission to first token) p50/p90 of every request but each stream's first (which finds the
cache cold), output tokens/s over the whole run (cold first requests included), and the cache's
hit/miss blocks. Per round: the paired ratios (on/off) of
TTFT p50 and tokens/s, and greedy outputs compared request by request between the modes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _ratios import verdict

from kiln_runtimes import backends
from kiln_runtimes.backends.base import EngineOptions
from kiln_runtimes.backends.genai import GenAIGenerationBackend
from kiln_runtimes.protocol import MANIFEST_NAME, GenerateRequest, ModelManifest

SENTENCE = (
    "Kiln serves embedding, tensor and chat models to many tenants, each with its own keys, "
    "quotas, budgets and bills; answer questions about it briefly, politely and accurately. "
)


class Prompts:
    """The shared system prompt (``system`` tokens) and request ``i``'s full prompt ids."""

    def __init__(self, model_dir: Path, system: int) -> None:
        from tokenizers import Tokenizer

        self._tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        words = (SENTENCE * (system // 20 + 1)).split(" ")
        ids = self._encode(" ".join(words))
        while len(ids) > system:  # drop words until the system turn is ``system`` tokens at most
            keep = len(words) * system // len(ids)  # as many words a token (whatever the vocab)
            words = words[: max(1, min(len(words) - 1, keep))]
            ids = self._encode(" ".join(words))
        self.system = " ".join(words)
        self.system_tokens = len(ids)

    def _encode(self, content: str) -> list[int]:
        text = f"<|im_start|>system\n{content}<|im_end|>\n"
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def ids(self, i: int) -> list[int]:
        question = f"Question {i}: how many tokens are {i} words, and what would {i} cost?"
        text = (
            f"<|im_start|>system\n{self.system}<|im_end|>\n"
            f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
        )
        return list(self._tok.encode(text, add_special_tokens=False).ids)


async def closed_loop(
    backend: GenAIGenerationBackend, prompts: Prompts, args: argparse.Namespace
) -> dict[str, Any]:
    """Each stream sends ``--requests`` requests back to back; TTFT counts all but each stream's
    first (which finds the cache cold), tokens/s all of them over the whole run."""
    start = time.perf_counter()
    counter = iter(range(1 << 30))
    ttfts: list[float] = []
    outputs: dict[int, list[int]] = {}

    async def stream() -> None:
        for n in range(args.requests):
            i = next(counter)
            request = GenerateRequest(
                request_id=f"r{i}", prompt_ids=prompts.ids(i), max_tokens=args.max_tokens,
                temperature=0.0, tenant="bench",
            )  # fmt: skip
            sent, tokens = time.perf_counter(), list[int]()
            async for chunk in backend.stream(request):
                now = time.perf_counter()
                if not tokens and n:
                    ttfts.append(now - sent)
                tokens += chunk.token_ids
            outputs[i] = tokens

    await asyncio.gather(*(stream() for _ in range(args.streams)))
    seconds = time.perf_counter() - start
    return {
        "requests": len(outputs),
        "seconds": round(seconds, 1),
        "ttft_ms": _spread(ttfts),
        "tokens_per_s": round(sum(map(len, outputs.values())) / seconds, 1),
        "outputs": outputs,
    }


async def run_mode(
    model_dir: Path, manifest: ModelManifest, prompts: Prompts, args: argparse.Namespace,
    cache_mb: int,
) -> dict[str, Any]:  # fmt: skip
    options = EngineOptions(
        max_batch_size=args.streams, threads=args.threads, prefix_cache_bytes=cache_mb << 20
    )
    backend = GenAIGenerationBackend(options, spin=args.spin)
    await backends.start(backend, model_dir, manifest, None)
    try:
        result = await closed_loop(backend, prompts, args)
        stats = backend.health().prefix_cache
        if stats is not None:
            result["cache"] = {
                "hit_blocks": stats.hit_blocks, "miss_blocks": stats.miss_blocks,
                "evicted_blocks": stats.evicted_blocks, "mb": stats.bytes >> 20,
            }  # fmt: skip
        return result
    finally:
        backend.unload()


def _spread(seconds: list[float]) -> dict[str, float]:
    p90 = statistics.quantiles(seconds, n=10)[-1] if len(seconds) > 1 else seconds[0]
    return {"p50": round(statistics.median(seconds) * 1000, 1), "p90": round(p90 * 1000, 1),
            "n": len(seconds)}  # fmt: skip


def _same(off: dict[int, list[int]], on: dict[int, list[int]]) -> tuple[int, int]:
    common = sorted(off.keys() & on.keys())
    return len(common), sum(off[i] == on[i] for i in common)


async def main(args: argparse.Namespace) -> None:
    model_dir = args.model_dir
    manifest = msgspec.json.decode((model_dir / MANIFEST_NAME).read_bytes(), type=ModelManifest)
    prompts = Prompts(model_dir, args.system)
    print(json.dumps({"system_tokens": prompts.system_tokens,
                      "prompt_tokens": len(prompts.ids(0)), "streams": args.streams}))  # fmt: skip
    ttft_ratios, rate_ratios = [], []
    for round_ in range(args.rounds):
        off = await run_mode(model_dir, manifest, prompts, args, 0)
        on = await run_mode(model_dir, manifest, prompts, args, args.cache_mb)
        compared, same = _same(off.pop("outputs"), on.pop("outputs"))
        ttft_ratios.append(on["ttft_ms"]["p50"] / off["ttft_ms"]["p50"])
        rate_ratios.append(on["tokens_per_s"] / off["tokens_per_s"])
        print(json.dumps({"round": round_, "off": off, "on": on,
                          "greedy_identical": f"{same}/{compared}"}))  # fmt: skip
    verdict("TTFT p50 on/off", ttft_ratios, 0.35, higher_is_better=False)
    verdict("tokens/s on/off", rate_ratios, 1.3, higher_is_better=True)


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--system", type=int, default=600, help="system prompt tokens")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--requests", type=int, default=4, help="per stream, the first warms")
    parser.add_argument("--no-spin", dest="spin", action="store_false")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cache-mb", type=int, default=256)
    parser.add_argument("--threads", type=int, default=0)
    return parser.parse_args()


if __name__ == "__main__":
    asyncio.run(main(parse()))
