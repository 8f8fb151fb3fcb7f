"""Per-token cost of the worker's sampler for each kind of request, on one row of SmolLM2-sized
logits (49,152 entries, normal(0, 3)), with no model: what the sampling parameters add to a
decode step (a one-stream step is ~5 ms on 2 cores, docs/llm-engine.md).

    python bench/sampling.py [--baseline OLD/_genai_sampling.py]

``--baseline``: a ``_genai_sampling.py`` from an older checkout (e.g. ``git show
967db3b:runtimes/src/kiln_runtimes/backends/_genai_sampling.py > /tmp/old.py``), timed on the
same plain requests, alternating with the current one. Prints one line per case: the best of 5
repeats, microseconds per token.
"""

from __future__ import annotations

import argparse
import importlib.util
import timeit
from pathlib import Path
from typing import Any

import numpy as np

from kiln_runtimes.backends._genai_sampling import Sampler
from kiln_runtimes.protocol import GenerateRequest

VOCAB = 49152
PLAIN: dict[str, dict[str, Any]] = {
    "greedy": {"temperature": 0.0},
    "temperature 0.8, top_p 0.9": {"top_p": 0.9},
}
SHAPED: dict[str, dict[str, Any]] = {
    "greedy + logprobs (top 5)": {"temperature": 0.0, "logprobs": 5},
    "greedy + penalties + logit_bias": {
        "temperature": 0.0, "presence_penalty": 0.5, "frequency_penalty": 0.5,
        "logit_bias": {5: -100.0},
    },
    "temperature 0.8, top_k 40, min_p 0.05": {"top_k": 40, "min_p": 0.05},
    "temperature 0.8, repetition_penalty 1.2 (64-token prompt)": {"repetition_penalty": 1.2},
}  # fmt: skip


def per_token_us(sampler: Any, row: np.ndarray, number: int) -> float:
    def one() -> None:
        sampler.sample(row)
        if hasattr(sampler, "take_logprobs"):
            sampler.take_logprobs(1)

    return min(timeit.repeat(one, number=number, repeat=5)) / number * 1e6


def sampler(fields: dict[str, Any]) -> Sampler:
    fields = {"temperature": 0.8, **fields}
    request = GenerateRequest(
        request_id="bench", prompt_ids=list(range(64)), max_tokens=1, seed=1, **fields
    )
    return Sampler.for_request(request)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--baseline", type=Path, default=None)
    args = parser.parse_args()
    row = np.random.default_rng(0).normal(0, 3, VOCAB).astype(np.float32)
    old = None
    if args.baseline is not None:
        spec = importlib.util.spec_from_file_location("baseline_sampling", args.baseline)
        if spec is None or spec.loader is None:
            raise SystemExit(f"cannot load {args.baseline}")
        old = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(old)
    for name, given in PLAIN.items():
        fields: dict[str, Any] = {"temperature": 0.8, **given}
        for _ in range(2):  # alternate, so drift hits both alike
            now = per_token_us(sampler(fields), row, 2000)
            line = f"{name:58s} {now:8.1f} us"
            if old is not None:
                before = old.Sampler(fields["temperature"], fields.get("top_p", 1.0), 1)
                line += f"   baseline {per_token_us(before, row, 2000):8.1f} us"
            print(line, flush=True)
    for name, fields in SHAPED.items():
        print(f"{name:58s} {per_token_us(sampler(fields), row, 500):8.1f} us", flush=True)


if __name__ == "__main__":
    main()
