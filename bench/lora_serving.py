"""LoRA adapters through ``/v1/chat/completions``: what serving a mix of adapters costs.

Two ``kiln up`` on SmolLM2, the same closed-loop streaming load (``_llm_load.py``: N clients,
greedy, 64 tokens), in the same run, alternating:

- ``base``: no adapter slots, every request to the base model (what Kiln serves by default);
- ``mixed``: ``KILN_WORKER_ADAPTER_SLOTS=4``, three uploaded adapters (rank 8 on q and v) and the
  base model, requests cycling over the four, so every step mixes adapters.

Prints output tokens/s of each and the ratio mixed ÷ base (docs/benchmarks.md).

    python bench/lora_serving.py [--model-dir DIR] [--streams 8] [--duration 20] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from _llm_load import SSEClient, measure_round
from _llm_servers import Kiln
from safetensors.numpy import save_file
from tokenizers import Tokenizer

ADAPTERS = ("support", "legal", "pirate")
QV = ("q_proj", "v_proj")


class MixedClient(SSEClient):
    """Request ``i`` names ``models[i % len(models)]``."""

    def __init__(self, models: list[str], *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.models = models

    def body(self, i: int) -> bytes:
        self.model = self.models[i % len(self.models)]
        return super().body(i)


def peft_files(model_dir: Path, folder: Path, seed: int) -> dict[str, tuple[str, bytes]]:
    """A made-up PEFT adapter (rank 8 on q and v) for ``model_dir``, as upload form files."""
    decoder = json.loads((model_dir / "genai_config.json").read_text())["model"]["decoder"]
    head, hidden = decoder["head_size"], decoder["hidden_size"]
    out = {"q_proj": decoder["num_attention_heads"] * head,
           "v_proj": decoder["num_key_value_heads"] * head}  # fmt: skip
    rng, tensors = np.random.default_rng(seed), {}
    for layer in range(decoder["num_hidden_layers"]):
        for module in QV:
            key = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            tensors[f"{key}.lora_A.weight"] = rng.normal(0, 0.05, (8, hidden)).astype(np.float32)
            tensors[f"{key}.lora_B.weight"] = rng.normal(0, 0.05, (out[module], 8)).astype(
                np.float32
            )
    save_file(tensors, str(folder / f"{seed}.safetensors"))
    config = {"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": list(QV)}
    return {
        "config": ("adapter_config.json", json.dumps(config).encode()),
        "weights": ("adapter_model.safetensors", (folder / f"{seed}.safetensors").read_bytes()),
    }


def upload_adapters(kiln: Kiln, model_dir: Path) -> list[str]:
    """Upload ``ADAPTERS`` for the bench tenant; returns the model names to call."""
    out = kiln.cli("keys", "create", "--tenant", "bench", "--role", "tenant-admin",
                   "--scope", "admin:write")  # fmt: skip
    admin = {"authorization": f"Bearer {out.strip().splitlines()[-1]}"}
    tenant = httpx.get(f"{kiln.base_url}/admin/v1/tenants", headers=admin).json()[0]["id"]
    names = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed, name in enumerate(ADAPTERS):
            r = httpx.post(
                f"{kiln.base_url}/admin/v1/tenants/{tenant}/adapters", headers=admin,
                data={"name": name, "model": kiln.model},
                files=peft_files(model_dir, Path(tmp), seed), timeout=60,
            )  # fmt: skip
            r.raise_for_status()
            names.append(r.json()["model"])
    return names


def measure(kiln: Kiln, models: list[str], args: argparse.Namespace, encode: Any) -> float:
    """Output tokens/s of one closed-loop round."""
    client = MixedClient(models, kiln.base_url, models[0], kiln.key, max_tokens=64, usage=True)
    return measure_round(kiln, client, args.streams, args.duration, encode)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--model-dir", type=Path, default=Path.home() / ".cache/kiln-test/smollm2")
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    tokenizer = Tokenizer.from_file(str(args.model_dir / "tokenizer.json"))

    def encode(texts: list[str]) -> list[list[int]]:
        return [e.ids for e in tokenizer.encode_batch(texts, add_special_tokens=False)]

    logs = Path(tempfile.mkdtemp(prefix="kiln-bench-lora-"))
    systems = {
        "base": Kiln(logs, args.model_dir),
        "mixed": Kiln(logs, args.model_dir, {"KILN_WORKER_ADAPTER_SLOTS": "4"}),
    }
    results: dict[str, list[float]] = {name: [] for name in systems}
    try:
        for kiln in systems.values():
            kiln.start()
        adapters = upload_adapters(systems["mixed"], args.model_dir)
        models = {"base": [systems["base"].model], "mixed": [systems["mixed"].model, *adapters]}
        for round_ in range(args.rounds):
            order = list(systems) if round_ % 2 == 0 else list(reversed(systems))
            for name in order:
                results[name].append(measure(systems[name], models[name], args, encode))
                print(
                    f"round {round_ + 1} {name}: {results[name][-1]:.1f} output tokens/s",
                    flush=True,
                )
    finally:
        for kiln in systems.values():
            kiln.stop()
    base, mixed = (statistics.median(results[n]) for n in ("base", "mixed"))
    print(
        f"\n{args.streams} streams, 64 output tokens, medians of {args.rounds} rounds "
        f"of {args.duration} s"
    )
    print(f"base model, no slots:           {base:7.1f} output tokens/s")
    print(f"3 adapters + base, 4 slots:     {mixed:7.1f} output tokens/s")
    print(f"mixed ÷ base:                   {mixed / base:.3f}")


if __name__ == "__main__":
    main()
