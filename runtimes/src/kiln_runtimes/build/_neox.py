"""GPT-NeoX (Pythia, Dolly v2, RedPajama-INCITE…) for the onnxruntime-genai builder, which does
not know it (``GPTNeoXForCausalLM``).

:mod:`._llamalike`'s LayerNorms and partial RoPE (a quarter of each head, non-interleaved),
biases everywhere, an exact-GELU MLP (``dense_h_to_4h``, ``dense_4h_to_h``), and one fused Q/K/V
projection whose rows run head by head (``[q, k, v]`` of head 0, then of head 1…): split here
into the three projections the builder takes. With ``use_parallel_residual`` (every Pythia) a
layer adds both its attention over one norm of the stream and its MLP over another norm of the
same stream; without, it is Llama's sequence.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from kiln_runtimes.build._llamalike import LayerNormed


class GptNeox(LayerNormed):
    """GPT-NeoX's decoder: ``GPTNeoXLayer``s under ``gpt_neox``."""

    def __init__(self, config: Any, *args: Any) -> None:
        config.num_key_value_heads = config.num_attention_heads  # no grouped queries
        super().__init__(config, *args)
        self.mlp_attrs["use_proj"], self.mlp_attrs["use_fc"] = False, True

    def is_layer(self, module: Any) -> bool:
        return type(module).__name__ == "GPTNeoXLayer"

    def has_final_norm(self, module: Any, model: Any) -> bool:
        return module is model.gpt_neox.final_layer_norm

    def make_layer(self, layer_id: int, layer: Any) -> None:
        parts = _split(layer.attention.query_key_value, self.num_attn_heads)
        attention = SimpleNamespace(dense=layer.attention.dense, **parts)
        mlp = SimpleNamespace(fc1=layer.mlp.dense_h_to_4h, fc2=layer.mlp.dense_4h_to_h)
        flat = SimpleNamespace(
            input_layernorm=layer.input_layernorm,
            self_attn=attention,
            post_attention_layernorm=layer.post_attention_layernorm,
            mlp=mlp,
        )
        if not layer.use_parallel_residual:
            super().make_layer(layer_id, flat)
            return
        norms = self.layernorm_attrs
        first = norms["first_layernorm"]
        self.make_layernorm(layer_id, flat.input_layernorm, skip=not first, simple=False,
                            location="input")  # fmt: skip
        self.make_attention(layer_id, attention, root_input=norms["output_0"])
        attended = norms["skip_input"]  # the MLP's norm reads the stream, as the input norm did
        self.make_layernorm(layer_id, flat.post_attention_layernorm, skip=False, simple=False,
                            location="post_attention")  # fmt: skip
        self.make_mlp(layer_id, mlp, root_input=norms["output_0"])
        name = f"/model/layers.{layer_id}/residual_add/Add"
        self.make_add(name, [attended, norms["skip_input"]], dtype=self.io_dtype,
                      shape=self.make_hidden_state_shape())  # fmt: skip
        norms["skip_input"], norms["first_layernorm"] = f"{name}/output_0", False
        norms["last_layernorm"] = layer_id == self.num_layers - 1

    num_attn_heads: int
    num_layers: int


def _split(fused: Any, heads: int) -> dict[str, SimpleNamespace]:
    """The fused ``query_key_value``'s rows, head by head ``[q, k, v]``, as three projections."""
    weight = fused.weight.view(heads, 3, -1, fused.weight.shape[-1])
    bias = fused.bias.view(heads, 3, -1) if fused.bias is not None else None
    return {
        f"{part}_proj": SimpleNamespace(
            weight=weight[:, i].reshape(-1, weight.shape[-1]),
            bias=bias[:, i].reshape(-1) if bias is not None else None,
        )
        for i, part in enumerate("qkv")
    }


MODEL_TYPES = {"gpt_neox": GptNeox}
ARCHITECTURES = ("GPTNeoXForCausalLM",)
