"""StableLM and Starcoder2 for the onnxruntime-genai builder, which has neither
(``StableLmForCausalLM``, ``Starcoder2ForCausalLM``).

Both are Llama's decoder with LayerNorms (weight and bias, at the config's epsilon) where Llama
has RMSNorms. StableLM keeps Llama's gated MLP and turns a share of each head
(``partial_rotary_factor``, a quarter) with RoPE; with ``use_parallel_residual`` its attention
and MLP read the same norm's output and both join the stream at once (Phi's layer). Starcoder2's
MLP is ``c_fc``, a tanh GELU, ``c_proj``, each with a bias (Phi's ``fc1``/``fc2``), its
attention has biases, and a ``sliding_window`` is served as Mistral's. StableLM 2 12B's
per-head Q/K LayerNorms (``qk_layernorm``) are refused, not built wrong. The builder's dispatch
knows Llama's name: their configs are read under it (``_builder.read_config``) and
``_builder.llama`` builds these classes by ``model_type``.
"""

from __future__ import annotations

import importlib
from types import SimpleNamespace
from typing import Any

import onnxruntime_genai.models  # noqa: F401 (puts the builder's own folder on sys.path)

builders: Any = importlib.import_module("builders")


class StableLm(builders.LlamaModel):  # type: ignore[misc]
    """StableLM's decoder: LayerNorms, partial RoPE, the parallel residual if configured."""

    def __init__(self, config: Any, *args: Any) -> None:
        if getattr(config, "qk_layernorm", False):
            raise ValueError("StableLM's per-head qk_layernorm is not built")
        super().__init__(config, *args)
        self.layernorm_attrs["simple"] = False
        self.layernorm_attrs["epsilon"] = config.layer_norm_eps

    def make_layer(self, layer_id: int, layer: Any) -> None:
        if layer.use_parallel_residual:
            builders.PhiModel.make_layer(self, layer_id, layer)
        else:
            super().make_layer(layer_id, layer)


class Starcoder2(builders.LlamaModel):  # type: ignore[misc]
    """Starcoder2's decoder: LayerNorms, biases, a plain GELU MLP."""

    def __init__(self, config: Any, *args: Any) -> None:
        super().__init__(config, *args)
        self.layernorm_attrs["simple"] = False
        self.layernorm_attrs["epsilon"] = config.norm_epsilon
        self.mlp_attrs["use_proj"], self.mlp_attrs["use_fc"] = False, True

    def make_mlp(self, layer_id: int, mlp: Any, root_input: str) -> None:
        super().make_mlp(layer_id, SimpleNamespace(fc1=mlp.c_fc, fc2=mlp.c_proj), root_input)


MODEL_TYPES = {"stablelm": StableLm, "starcoder2": Starcoder2}
HOST = "LlamaForCausalLM"
"""The builder's name these are read under."""
