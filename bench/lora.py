"""What adapter slots cost a generation step: decode steps of the SmolLM2 graph as built vs the
graph with adapter slots (no adapter in use, and an adapter on every row), in-process, same run.

    python bench/lora.py --model-dir ~/.cache/kiln-test/smollm2 [--slots 4 --rank 16]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import msgspec
import numpy as np

from kiln_runtimes.backends._genai_config import load_spec
from kiln_runtimes.backends._genai_runner import ModelRunner
from kiln_runtimes.backends._genai_scheduler import PrefillWork, StepPlan
from kiln_runtimes.lora import Adapter, Dims
from kiln_runtimes.protocol import MANIFEST_NAME, ModelManifest


def adapter(dims: Dims, rank: int, seed: int) -> Adapter:
    rng = np.random.default_rng(seed)
    a, b = {}, {}
    for layer in range(dims.num_layers):
        for module in ("q_proj", "v_proj"):
            fan_in, fan_out = dims.shape(module)
            a[layer, module] = rng.normal(0, 0.05, (fan_in, rank)).astype(np.float32)
            b[layer, module] = rng.normal(0, 0.05, (rank, fan_out)).astype(np.float32)
    return Adapter(rank=rank, alpha=rank, modules=("q_proj", "v_proj"), a=a, b=b)


def steps_per_s(runner: ModelRunner, rows: int, adapters: tuple[int, ...], seconds: float) -> float:
    prompt = tuple(range(100, 164))
    for row in range(rows):
        runner.execute(StepPlan(prefills=(PrefillWork(row, 0, prompt, True, adapters[row]),)))
    lengths = (len(prompt),) * rows
    batch = StepPlan((), tuple(range(rows)), (7,) * rows, lengths, adapters)
    runner.execute(batch)
    times = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        started = time.perf_counter()
        runner.execute(batch)
        times.append(time.perf_counter() - started)
    return 1 / statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--model-dir", type=Path, default=Path.home() / ".cache/kiln-test/smollm2")
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    manifest = msgspec.json.decode(
        (args.model_dir / MANIFEST_NAME).read_bytes(), type=ModelManifest
    )
    spec = load_spec(args.model_dir, manifest)
    dims = Dims.from_genai_config(json.loads((args.model_dir / "genai_config.json").read_text()))
    base = ModelRunner(spec, 8)
    slotted = ModelRunner(spec, 8, adapter_slots=args.slots, adapter_rank=args.rank)
    assert slotted.adapters is not None
    for slot in range(args.slots):
        slotted.adapters.load(slot, adapter(dims, min(8, args.rank // 2), slot))
    print(f"decode steps/s, {args.slots} slots of rank {args.rank}, median of {args.seconds} s")
    header = ("rows", "as built", "slots, no adapter", "adapter per row", "ratios")
    print("{:>4} {:>9} {:>18} {:>16} {:>14}".format(*header))
    for rows in (1, 8):
        plain = steps_per_s(base, rows, (-1,) * rows, args.seconds)
        idle = steps_per_s(slotted, rows, (-1,) * rows, args.seconds)
        every = tuple(r % args.slots for r in range(rows))
        used = steps_per_s(slotted, rows, every, args.seconds)
        ratios = f"{idle / plain:.3f} {used / plain:.3f}"
        print(f"{rows:>4} {plain:>9.1f} {idle:>18.1f} {used:>16.1f}   {ratios}")


if __name__ == "__main__":
    main()
