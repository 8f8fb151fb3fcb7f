"""Cohere's Command R (1 and 2) for the onnxruntime-genai builder, which has neither
(``CohereForCausalLM``: Command R, Aya 23, Aya Expanse; ``Cohere2ForCausalLM``: Command R7B).

Llama's decoder with :mod:`._llamalike`'s LayerNorms, here without bias, in Phi's parallel
layer (attention and MLP read one norm's output and join the stream at once); its RoPE turns
interleaved pairs (``x[..., ::2]`` with ``x[..., 1::2]``) and its logits are scaled
(``logit_scale``); Command R+ norms each head's query and key (``use_qk_norm``). Cohere 2
slides a window on its ``sliding_attention`` layers, and only those turn with RoPE. Read under
Llama's name and built by ``model_type`` as :mod:`._llamalike`'s.
"""

from __future__ import annotations

import importlib
from types import SimpleNamespace
from typing import Any

import onnxruntime_genai.models  # noqa: F401 (puts the builder's own folder on sys.path)

from kiln_runtimes.build import _rope
from kiln_runtimes.build._llamalike import LayerNormed

builders: Any = importlib.import_module("builders")


class Cohere(LayerNormed):
    """Command R's decoder: parallel layers, bias-free LayerNorms, interleaved RoPE."""

    qk_norms = "use_qk_norm"

    def __init__(self, config: Any, *args: Any) -> None:
        super().__init__(config, *args)
        self.rope_attrs["interleaved"] = 1
        self.lm_head_attrs["scale"] = config.logit_scale

    def make_layer(self, layer_id: int, layer: Any) -> None:
        builders.PhiModel.make_layer(self, layer_id, layer)

    def make_layernorm(self, layer_id: int, layernorm: Any, *args: Any, **kwargs: Any) -> None:
        if getattr(layernorm, "bias", None) is None:  # CohereLayerNorm: a scale, no shift
            layernorm = SimpleNamespace(
                weight=layernorm.weight, bias=layernorm.weight.new_zeros(layernorm.weight.shape)
            )
        super().make_layernorm(layer_id, layernorm, *args, **kwargs)


class Cohere2(Cohere):
    """Command R7B's decoder: Cohere's, windowed layers with RoPE, global ones without."""

    window_size: int

    def make_attention(self, layer_id: int, attention: Any, root_input: str, **kwargs: Any) -> None:
        full = self.layer_types[layer_id] == "full_attention"
        with _rope.without(self, rope=full, window=full):
            super().make_attention(layer_id, attention, root_input, **kwargs)


MODEL_TYPES = {"cohere": Cohere, "cohere2": Cohere2}
