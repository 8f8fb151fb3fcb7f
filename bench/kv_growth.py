"""The worker's KV cache as a sequence grows: ``reserve`` at each capacity boundary, and the
inter-token gaps and RSS of one long stream through Kiln's GenAI backend (no HTTP, no gateway).

    python bench/kv_growth.py MODEL_DIR [--slots 32] [--tokens 2000] [--threads 0]

``--slots``: the worker's ``--max-batch-size`` (the platform's default is 32). The stream has the
shape of ``tests/e2e/test_stream_leases.py``: one chat prompt, temperature 0.9, seed 7. Prints one
JSON object: ``stream.gap_ms_near`` (the largest inter-token gap within 16 positions of each
boundary), ``stream.gap_ms`` (p50, p99, max over the stream), ``stream.rss_mb`` (after load, peak,
after the idle shrink), and ``boundary_step_ms`` (on a fresh runner, a one-row decode step that
takes a sequence past each boundary, and the step before it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import time
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from kiln_runtimes import backends
from kiln_runtimes.backends._genai_config import load_spec
from kiln_runtimes.backends._genai_runner import ModelRunner
from kiln_runtimes.backends._genai_scheduler import StepPlan
from kiln_runtimes.backends.base import EngineOptions
from kiln_runtimes.backends.genai import GenAIGenerationBackend
from kiln_runtimes.protocol import MANIFEST_NAME, GenerateRequest, ModelManifest

BOUNDARIES = (512, 1024, 2048)
PROMPT = "Write a very long, detailed story about a lighthouse."


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def _boundary_steps(model_dir: Path, manifest: ModelManifest, slots: int) -> dict[str, float]:
    runner = ModelRunner(load_spec(model_dir, manifest), slots)
    times = {}
    for boundary in (256, *BOUNDARIES[:-1]):
        for length in (boundary - 1, boundary):  # the step writing position ``length``
            started = time.perf_counter()
            runner.execute(StepPlan((), (0,), (5,), (length,)))
            times[str(length + 1)] = round((time.perf_counter() - started) * 1000, 1)
    return times


def _prompt(model_dir: Path) -> list[int]:
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    from tokenizers import Tokenizer

    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    template = ImmutableSandboxedEnvironment().from_string(config["chat_template"])
    messages = [{"role": "user", "content": PROMPT}]
    text = template.render(messages=messages, add_generation_prompt=True)
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    return list(tokenizer.encode(text, add_special_tokens=False).ids)


async def _stream(model_dir: Path, manifest: ModelManifest, args: argparse.Namespace) -> Any:
    options = EngineOptions(max_batch_size=args.slots, threads=args.threads)
    backend = GenAIGenerationBackend(options)
    await backends.start(backend, model_dir, manifest, None)
    loaded = _rss_mb()
    prompt = _prompt(model_dir)
    request = GenerateRequest(
        request_id="long", prompt_ids=prompt, max_tokens=args.tokens, temperature=0.9, seed=7
    )
    stamps: list[tuple[int, float]] = []
    position = len(prompt)
    async for chunk in backend.stream(request):
        position += len(chunk.token_ids)
        stamps.append((position, time.perf_counter()))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    await asyncio.sleep(0.5)  # the engine shrinks the cache once it is idle
    idle = _rss_mb()
    backend.unload()
    gaps = np.diff([t for _, t in stamps]) * 1000
    positions = [p for p, _ in stamps[1:]]
    pairs = list(zip(positions, gaps, strict=True))
    near = {
        str(b): round(float(max(g for p, g in pairs if abs(p - b) <= 16)))
        for b in BOUNDARIES
        if positions[-1] > b + 16
    }
    spread = {q: float(np.percentile(gaps, p)) for q, p in (("p50", 50), ("p99", 99))}
    return {
        "positions": positions[-1],
        "gap_ms_near": near,
        "gap_ms": {k: round(v, 1) for k, v in (spread | {"max": float(gaps.max())}).items()},
        "rss_mb": {"loaded": round(loaded), "peak": round(peak), "idle": round(idle)},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--slots", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args()
    raw = (args.model_dir / MANIFEST_NAME).read_bytes()
    manifest = msgspec.json.decode(raw, type=ModelManifest)
    out: dict[str, Any] = {"slots": args.slots}
    out["stream"] = asyncio.run(_stream(args.model_dir, manifest, args))
    out["boundary_step_ms"] = _boundary_steps(args.model_dir, manifest, args.slots)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
