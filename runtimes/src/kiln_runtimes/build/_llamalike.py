"""StableLM and Starcoder2 for the onnxruntime-genai builder, which has neither
(``StableLmForCausalLM``, ``Starcoder2ForCausalLM``).

Each is Llama's decoder with LayerNorms (weight and bias, at the config's epsilon) where Llama
has RMSNorms (:class:`LayerNormed`, :mod:`._cohere`'s too). StableLM keeps Llama's gated MLP and
turns a share of each head (``partial_rotary_factor``, a quarter) with RoPE; with
``use_parallel_residual`` its attention and MLP read the same norm's output and both join the
stream at once (Phi's layer). Starcoder2's MLP is ``c_fc``, a tanh GELU, ``c_proj``, each with
a bias (Phi's ``fc1``/``fc2``), its attention has biases, and a ``sliding_window`` is served as
Mistral's. StableLM 2 12B's per-head Q/K LayerNorms (``qk_layernorm``) are refused, not built
wrong. The builder's dispatch knows Llama's name: their configs are read under it
(``_builder.read_config``) and ``_builder.by_model_type`` builds these classes.
"""

from __future__ import annotations

import importlib
from types import SimpleNamespace
from typing import Any

import onnxruntime_genai.models  # noqa: F401 (puts the builder's own folder on sys.path)

builders: Any = importlib.import_module("builders")


class LayerNormed(builders.LlamaModel):  # type: ignore[misc]
    """Llama's decoder with LayerNorms (at the config's epsilon: ``_builder.read_epsilon``); a
    config that turns on what is not built (``refused``) is refused."""

    refused: tuple[str, str] | None = None

    def __init__(self, config: Any, *args: Any) -> None:
        if self.refused and getattr(config, self.refused[0], False):
            raise ValueError(f"{self.refused[1]} ({self.refused[0]}) are not built")
        super().__init__(config, *args)
        self.layernorm_attrs["simple"] = False


class StableLm(LayerNormed):
    """StableLM's decoder: LayerNorms, partial RoPE, the parallel residual if configured."""

    refused = ("qk_layernorm", "StableLM's per-head Q/K norms")

    def make_layer(self, layer_id: int, layer: Any) -> None:
        if layer.use_parallel_residual:
            builders.PhiModel.make_layer(self, layer_id, layer)
        else:
            super().make_layer(layer_id, layer)


class Starcoder2(LayerNormed):
    """Starcoder2's decoder: LayerNorms, biases, a plain GELU MLP."""

    def __init__(self, config: Any, *args: Any) -> None:
        super().__init__(config, *args)
        self.mlp_attrs["use_proj"], self.mlp_attrs["use_fc"] = False, True

    def make_mlp(self, layer_id: int, mlp: Any, root_input: str) -> None:
        super().make_mlp(layer_id, SimpleNamespace(fc1=mlp.c_fc, fc2=mlp.c_proj), root_input)


MODEL_TYPES = {"stablelm": StableLm, "starcoder2": Starcoder2}
