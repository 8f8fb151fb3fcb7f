"""What a prefill chunk adds to a decode step: the engine's step costs on the built SmolLM2 folder,
in-process (Kiln's ``ModelRunner``, no scheduler, no HTTP), to choose the worker's prefill budget
while sequences decode (``--decoding-prefill``; docs/llm-engine.md).

    python bench/prefill_steps.py [MODEL_DIR] [--rows 16] [--context 200] [--repeats 15]

Prints one JSON object: the median ms of a decode step over ``--rows`` rows at ``--context``
positions, and of one prefill call per chunk length on a free row; each chunk's cost is also
given as a multiple of the decode step (a running stream's gap grows by that much in a step that
carries the chunk).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import msgspec
import numpy as np

from kiln_runtimes.backends._genai_config import load_spec
from kiln_runtimes.backends._genai_runner import ModelRunner
from kiln_runtimes.backends._genai_scheduler import PrefillWork, StepPlan
from kiln_runtimes.protocol import MANIFEST_NAME, ModelManifest

CHUNKS = (16, 24, 32, 64, 128)


def _median_ms(call: Callable[[], object], repeats: int) -> float:
    call()  # warm: first runs allocate
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(1000 * (time.perf_counter() - start))
    return round(statistics.median(times), 1)


def main() -> None:
    default = Path.home() / ".cache" / "kiln-test" / "smollm2"
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model_dir", type=Path, nargs="?", default=default)
    p.add_argument("--rows", type=int, default=16)
    p.add_argument("--context", type=int, default=200)
    p.add_argument("--repeats", type=int, default=15)
    args = p.parse_args()
    raw = (args.model_dir / MANIFEST_NAME).read_bytes()
    manifest = msgspec.json.decode(raw, type=ModelManifest)
    runner = ModelRunner(load_spec(args.model_dir, manifest), args.rows + 1)
    rows = tuple(range(args.rows))
    decode = StepPlan((), rows, (5,) * args.rows, (args.context,) * args.rows)
    decode_ms = _median_ms(lambda: runner.execute(decode), args.repeats)
    rng = np.random.default_rng(0)
    prefill_ms = {}
    for n in CHUNKS:
        tokens = tuple(rng.integers(3, runner.spec.vocab_size, n).tolist())
        plan = StepPlan(prefills=(PrefillWork(args.rows, 0, tokens, True),))
        prefill_ms[n] = _median_ms(lambda plan=plan: runner.execute(plan), args.repeats)
    out = {
        "model": manifest.name, "precision": manifest.precision,
        "decode_rows": args.rows, "context": args.context, "decode_step_ms": decode_ms,
        "prefill_ms": prefill_ms,
        "prefill_over_decode": {n: round(ms / decode_ms, 2) for n, ms in prefill_ms.items()},
    }  # fmt: skip
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
