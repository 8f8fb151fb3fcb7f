"""GLM and GLM-4 for the onnxruntime-genai builder, which has neither (``GlmForCausalLM``:
glm-4-9b-chat-hf; ``Glm4ForCausalLM``: GLM-4-0414, GLM-Z1).

GLM is Llama's decoder whose RoPE turns interleaved pairs (``x[..., ::2]`` with ``x[..., 1::2]``)
on half of each head (``partial_rotary_factor``), with Q/K/V biases and one fused
``gate_up_proj`` (the builder splits it). GLM-4 adds a norm after each sublayer, before it joins
the stream (``post_self_attn_layernorm``, ``post_mlp_layernorm``), OLMo 2's post-norms beside
Llama's pre-norms. Read under Llama's name and built by ``model_type`` (``_kilns.HOSTS``).
"""

from __future__ import annotations

import importlib
from typing import Any

import onnxruntime_genai.models  # noqa: F401 (puts the builder's own folder on sys.path)

from kiln_runtimes.build._olmo2 import Olmo2

builders: Any = importlib.import_module("builders")


class Glm(builders.LlamaModel):  # type: ignore[misc]
    """GLM's decoder: Llama's, its partial RoPE on interleaved pairs."""

    def __init__(self, config: Any, *args: Any) -> None:
        super().__init__(config, *args)
        self.rope_attrs["interleaved"] = 1


class Glm4(Glm):
    """GLM-4's decoder: GLM's, each sublayer's output normed before the residual add."""

    def make_layer(self, layer_id: int, layer: Any) -> None:
        norms = self.layernorm_attrs
        self.make_layernorm(layer_id, layer.input_layernorm, skip=not norms["first_layernorm"],
                            simple=True, location="input")  # fmt: skip
        self.make_attention(layer_id, layer.self_attn, root_input=norms["output_0"])
        Olmo2._post_norm(self, layer_id, layer.post_self_attn_layernorm, "post_self_attn")
        Olmo2._residual(self, layer_id, "attn")
        self.make_layernorm(layer_id, layer.post_attention_layernorm, skip=False, simple=True,
                            location="post_attention")  # fmt: skip
        self.make_mlp(layer_id, layer.mlp, root_input=norms["output_0"])
        Olmo2._post_norm(self, layer_id, layer.post_mlp_layernorm, "post_mlp")
        norms["skip_input"] = norms["output_0"]  # the next norm's SkipLayerNorm adds it
        norms["first_layernorm"] = False
        norms["last_layernorm"] = layer_id == self.num_layers - 1

    num_layers: int


MODEL_TYPES = {"glm": Glm, "glm4": Glm4}
