"""What the engine needs to know about a GenAI model folder, read from ``genai_config.json``."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kiln_runtimes.lora import Dims

if TYPE_CHECKING:
    from pathlib import Path

    from kiln_runtimes.protocol import ModelManifest

GENAI_CONFIG = "genai_config.json"
STATES = ("past_conv_names", "past_recurrent_names")
"""Recurrent states a decoder's linear-attention layers carry (Qwen 3.5's Gated DeltaNet: its
convolution's last inputs and the recurrent matrix), one of each such layer."""
FED = frozenset({"input_ids", "attention_mask", "past_key_names", "past_value_names", *STATES})
"""The decoder inputs Kiln's runner feeds: token ids, the mask, a KV cache of every attention
layer and the states of every linear-attention one."""


def unfed(decoder: dict[str, Any]) -> str | None:
    """Why Kiln's runner cannot run a ``genai_config.json`` decoder, if it cannot: inputs it
    does not feed (``position_ids``, as a Qwen2.5-VL folder built without Kiln's mends takes
    them; a state of a kind it does not know), named."""
    extra = sorted(set(decoder.get("inputs") or {}) - FED)
    if not extra:
        return None
    return (
        f"the graph takes inputs Kiln's runner does not feed ({', '.join(extra)}): it runs "
        "decoders whose state is a KV cache and linear-attention states, their positions read "
        "from the mask"
    )


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """A decoder-only model with a GroupQueryAttention KV cache, as the GenAI builder exports it."""

    model_path: Path
    num_layers: int
    num_kv_heads: int
    head_size: int
    vocab_size: int
    context_length: int
    eos_token_ids: frozenset[int]
    pad_token_id: int
    input_ids: str = "input_ids"
    attention_mask: str = "attention_mask"
    past_key: str = "past_key_values.%d.key"
    past_value: str = "past_key_values.%d.value"
    present_key: str = "present.%d.key"
    present_value: str = "present.%d.value"
    logits: str = "logits"
    states: tuple[tuple[str, str], ...] = ()
    """``(past input, present output)`` name templates of the recurrent states (``STATES``)."""
    dims: Dims | None = None
    """Attention shapes, for adapter slots (``None``: the config does not say)."""

    def kv_names(self) -> list[tuple[str, str]]:
        """``(past input, present output)`` name pairs, keys and values of every layer."""
        pairs = []
        for layer in range(self.num_layers):
            pairs.append((self.past_key % layer, self.present_key % layer))
            pairs.append((self.past_value % layer, self.present_value % layer))
        return pairs

    def state_names(self) -> list[tuple[str, str]]:
        """``(past input, present output)`` name pairs of every layer's recurrent states."""
        return [(past % layer, present % layer)
                for layer in range(self.num_layers) for past, present in self.states]  # fmt: skip


def load_spec(model_dir: Path, manifest: ModelManifest) -> ModelSpec:
    """Read ``genai_config.json``; the model file must stay inside ``model_dir``."""
    root = model_dir.resolve()
    config = json.loads((root / GENAI_CONFIG).read_text())
    path = (root / manifest.model_file).resolve()
    if not path.is_relative_to(root):
        raise ValueError(f"model file {manifest.model_file!r} is outside {root}")
    return spec_from_config(config, path, manifest.context_length)


def spec_from_config(config: dict[str, Any], model_path: Path, context_length: int) -> ModelSpec:
    """Build a ``ModelSpec`` from a parsed ``genai_config.json``."""
    model = config["model"]
    decoder = model["decoder"]
    if "dynamic_batching" in config.get("engine", {}):
        raise ValueError("paged-attention exports are not supported")
    if why := unfed(decoder):
        raise ValueError(why)
    context = min(context_length, int(model["context_length"]))
    window = decoder.get("sliding_window") or {}
    if window.get("layers") and int(window.get("window_size", 0)) > context:
        # a graph attending by windows (Gemma 2's) needs a cache of one window at least
        raise ValueError(f"a sliding window of {window['window_size']} positions is longer than "
                         f"the context of {context}")  # fmt: skip
    inputs, outputs = decoder.get("inputs", {}), decoder.get("outputs", {})
    eos = model["eos_token_id"]
    eos_ids = frozenset(eos if isinstance(eos, list) else [eos])
    pad = model.get("pad_token_id", min(eos_ids))
    return ModelSpec(
        model_path=model_path,
        num_layers=int(decoder["num_hidden_layers"]),
        num_kv_heads=int(decoder["num_key_value_heads"]),
        head_size=int(decoder["head_size"]),
        vocab_size=int(model["vocab_size"]),
        context_length=context,
        eos_token_ids=eos_ids,
        pad_token_id=int(pad[0] if isinstance(pad, list) else pad),
        input_ids=inputs.get("input_ids", "input_ids"),
        attention_mask=inputs.get("attention_mask", "attention_mask"),
        past_key=inputs.get("past_key_names", "past_key_values.%d.key"),
        past_value=inputs.get("past_value_names", "past_key_values.%d.value"),
        present_key=outputs.get("present_key_names", "present.%d.key"),
        present_value=outputs.get("present_value_names", "present.%d.value"),
        logits=outputs.get("logits", "logits"),
        states=tuple(
            (inputs[name], outputs[name.replace("past_", "present_")])
            for name in STATES
            if name in inputs
        ),
        dims=Dims.from_genai_config(config) if _has_dims(decoder) else None,
    )


def _has_dims(decoder: dict[str, Any]) -> bool:
    return all(k in decoder for k in ("hidden_size", "num_attention_heads", "head_size"))
