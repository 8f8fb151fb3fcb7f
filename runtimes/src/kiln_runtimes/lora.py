"""LoRA adapters for generation models: read a PEFT adapter, pack it for an adapter slot.

A worker serving a model with adapter slots adds, to every attention projection ``y = x·W`` of
its graph, ``y += ((x·A) ⊙ mask)·B``: ``A`` ``[in, slots·rank]`` and ``B`` ``[slots·rank, out]``
hold every loaded adapter side by side, and ``mask`` ``[rows, 1, slots·rank]`` picks, per row, the
columns of that row's adapter (none: the base model). One step can so mix rows of different
adapters, as Punica and S-LoRA do on GPUs (``backends/_genai_lora.py`` patches the graph).

Here is what both sides share: the gateway validates an upload with :func:`read_adapter` and the
worker packs it with the same function. Numpy and ``safetensors`` only; no torch.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

    import numpy.typing as npt

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PEFT_DEFAULT_ALPHA = 8
"""``LoraConfig.lora_alpha`` when a config leaves it out."""
MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
"""PEFT ``target_modules`` an adapter may name (attention projections)."""
_KEY = re.compile(
    r"^(?:base_model\.model\.)?model\.layers\.(\d+)\.self_attn\.(\w+)\.lora_([AB])(?:\.default)?\.weight$"
)

Float32 = np.ndarray[Any, np.dtype[np.float32]]


class AdapterError(ValueError):
    """An adapter this model cannot serve; ``field`` names what is wrong."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True, kw_only=True)
class Dims:
    """The attention shapes of a decoder, from ``genai_config.json``."""

    num_layers: int
    hidden: int
    q_size: int
    kv_size: int

    @classmethod
    def from_genai_config(cls, config: Mapping[str, Any]) -> Dims:
        decoder = config["model"]["decoder"]
        head = int(decoder["head_size"])
        return cls(
            num_layers=int(decoder["num_hidden_layers"]),
            hidden=int(decoder["hidden_size"]),
            q_size=int(decoder["num_attention_heads"]) * head,
            kv_size=int(decoder["num_key_value_heads"]) * head,
        )

    def shape(self, module: str) -> tuple[int, int]:
        """``(in, out)`` of one projection."""
        return {
            "q_proj": (self.hidden, self.q_size),
            "k_proj": (self.hidden, self.kv_size),
            "v_proj": (self.hidden, self.kv_size),
            "o_proj": (self.q_size, self.hidden),
        }[module]


@dataclass(frozen=True, kw_only=True)
class Adapter:
    """A PEFT LoRA adapter, scaled and transposed for ``x·A·B``: per (layer, module)."""

    rank: int
    alpha: float
    modules: tuple[str, ...]
    a: dict[tuple[int, str], Float32]
    """``[in, r]`` per (layer, module)."""
    b: dict[tuple[int, str], Float32]
    """``[r, out]``, already multiplied by the scaling ``alpha / r``."""

    @property
    def nbytes(self) -> int:
        return sum(m.nbytes for m in (*self.a.values(), *self.b.values()))


def load_adapter(folder: Path, dims: Dims, max_rank: int) -> Adapter:
    """Read ``adapter_config.json`` and ``adapter_model.safetensors`` from ``folder``."""
    from safetensors.numpy import load_file

    config = _json(folder / CONFIG_FILE)
    return read_adapter(config, load_file(str(folder / WEIGHTS_FILE)), dims, max_rank)


def read_adapter(
    config: Mapping[str, Any], tensors: Mapping[str, npt.NDArray[Any]], dims: Dims, max_rank: int
) -> Adapter:
    """Check a PEFT LoRA adapter against the model and the slot rank; raises ``AdapterError``."""
    found = {m[2] for m in map(_KEY.match, tensors) if m is not None}
    rank, alpha, modules = _check_config(config, max_rank, found)
    a: dict[tuple[int, str], Float32] = {}
    b: dict[tuple[int, str], Float32] = {}
    scaling = alpha / (math.sqrt(rank) if config.get("use_rslora") else rank)
    for key, tensor in tensors.items():
        match = _KEY.match(key)
        if match is None:
            raise AdapterError(
                f"tensor {key!r} is not a LoRA weight of an attention layer", "weights"
            )
        layer, module, side = int(match[1]), match[2], match[3]
        if module not in modules or layer >= dims.num_layers:
            raise AdapterError(f"tensor {key!r} is outside the adapter's target modules", "weights")
        fan_in, fan_out = dims.shape(module)
        expected = (rank, fan_in) if side == "A" else (fan_out, rank)
        if tuple(tensor.shape) != expected:
            raise AdapterError(
                f"tensor {key!r} has shape {tuple(tensor.shape)}, this model needs {expected}",
                "weights",
            )
        weight = np.ascontiguousarray(tensor.astype(np.float32).T)
        if not np.isfinite(weight).all():
            raise AdapterError(f"tensor {key!r} is not finite", "weights")
        if side == "A":
            a[layer, module] = weight
        else:
            b[layer, module] = weight * np.float32(scaling)
    if not a or a.keys() != b.keys():
        raise AdapterError(
            "every LoRA A weight needs its B weight, and there must be some", "weights"
        )
    return Adapter(rank=rank, alpha=alpha, modules=modules, a=a, b=b)


def _check_config(
    config: Mapping[str, Any], max_rank: int, found: set[str]
) -> tuple[int, float, tuple[str, ...]]:
    if config.get("peft_type", "LORA") != "LORA":
        raise AdapterError(f"peft_type {config.get('peft_type')!r} is not LORA", "config")
    if config.get("use_dora") or config.get("bias", "none") != "none":
        raise AdapterError("DoRA and LoRA biases are not supported", "config")
    if config.get("fan_in_fan_out"):
        raise AdapterError(
            "fan_in_fan_out adapters (GPT-2 style Conv1D) are not supported", "config"
        )
    if config.get("modules_to_save") or config.get("rank_pattern") or config.get("alpha_pattern"):
        raise AdapterError("modules_to_save and per-module ranks are not supported", "config")
    rank, alpha = config.get("r"), config.get("lora_alpha", PEFT_DEFAULT_ALPHA)
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise AdapterError("r must be a positive integer", "config")
    if not isinstance(alpha, int | float) or isinstance(alpha, bool):
        raise AdapterError("lora_alpha must be a number", "config")
    names = _targets(config.get("target_modules"), found)
    if not isinstance(names, list) or not names or not set(names) <= set(MODULES):
        raise AdapterError(f"target_modules must be some of {', '.join(MODULES)}", "config")
    modules = tuple(m for m in MODULES if m in names)
    packed = sum(m in modules for m in ("q_proj", "k_proj", "v_proj")) * rank
    if max(packed, rank) > max_rank:
        raise AdapterError(
            f"rank {rank} over {len(modules)} modules needs {max(packed, rank)} columns per slot; "
            f"this model's slots have {max_rank} (q, k and v share one)",
            "config",
        )
    return rank, float(alpha), modules


def _targets(targets: Any, found: set[str]) -> Any:
    """``target_modules`` as module names. PEFT reads a string as a regular expression that
    module paths match whole (``.*\\.(q_proj|v_proj)``), or ``all-linear``: the adapter's
    modules are then the attention ones its weights hold (any other weight is refused), each
    of which the expression must match."""
    if not isinstance(targets, str) or targets in MODULES:
        return [targets] if isinstance(targets, str) else targets
    if targets == "all-linear":  # PEFT's every linear layer: the weights say which ones
        return sorted(found)
    try:
        pattern = re.compile(targets)
    except re.error as exc:
        raise AdapterError(f"target_modules is not a regular expression: {exc}", "config") from exc
    paths = [f"model.layers.0.self_attn.{module}" for module in found]
    if not found or not all(pattern.fullmatch(path) for path in paths):
        raise AdapterError(
            f"target_modules {targets!r} must match the attention modules the weights hold "
            f"({', '.join(sorted(found)) or 'none'})", "config",
        )  # fmt: skip
    return sorted(found)


def _json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise AdapterError(f"{path.name} is not readable JSON: {exc}", "config") from exc
    if not isinstance(value, dict):
        raise AdapterError(f"{path.name} must be a JSON object", "config")
    return value


class SlotTable:
    """Which adapter each of ``slots`` adapter slots holds; pure bookkeeping for the scheduler.

    A slot is pinned while sequences of its adapter run; an unpinned slot keeps its adapter (a
    later sequence reuses it without reloading) until the least recently used one is needed.
    """

    def __init__(self, slots: int) -> None:
        self._keys: list[str | None] = [None] * slots
        self._pins = [0] * slots
        self._used = [0] * slots
        self._clock = 0

    def acquire(self, key: str) -> tuple[int, bool] | None:
        """Pin a slot for ``key``: ``(slot, must_load)``, or ``None`` while all are pinned."""
        self._clock += 1
        if key in self._keys:
            slot = self._keys.index(key)
            self._pins[slot] += 1
            return slot, False
        free = [s for s, pins in enumerate(self._pins) if pins == 0]
        if not free:
            return None
        slot = min(free, key=lambda s: (self._keys[s] is not None, self._used[s]))
        self._keys[slot], self._pins[slot] = key, 1
        return slot, True

    def release(self, key: str) -> None:
        slot = self._keys.index(key)
        self._pins[slot] -= 1
        self._clock += 1
        self._used[slot] = self._clock

    def loaded(self) -> int:
        return sum(key is not None for key in self._keys)
