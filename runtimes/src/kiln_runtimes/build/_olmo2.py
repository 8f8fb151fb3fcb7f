"""OLMo 2 for the onnxruntime-genai builder, which has no such model (``Olmo2ForCausalLM``).

OLMo 2's layer is Llama's but for where its norms sit, as transformers runs it: none before
attention or the MLP, an RMSNorm of each one's output before it joins the residual stream
(``post_attention_layernorm``, ``post_feedforward_layernorm``), and RMSNorms of the whole query
and key projections (``q_norm``, ``k_norm``: across all heads, not per head as Qwen 3's and
Gemma 3's, so not the builder's own ``make_qk_norm``). The builder's dispatch knows OLMo's name
only: an OLMo 2 config is read under it (:func:`renamed`), and ``_builder.olmo`` builds OLMo 2's
class for an ``olmo2`` config.
"""

from __future__ import annotations

import importlib
from typing import Any

import onnxruntime_genai.models  # noqa: F401 (puts the builder's own folder on sys.path)

builders: Any = importlib.import_module("builders")


class Olmo2(builders.LlamaModel):  # type: ignore[misc]
    """OLMo 2's decoder: post-norms, and Q/K norms over the whole projections."""

    def __init__(self, config: Any, *args: Any) -> None:
        super().__init__(config, *args)
        self.attention_attrs["q_norm"] = self.attention_attrs["k_norm"] = True

    def is_fused_qk_norm_gqa_supported(self) -> bool:
        return False  # the fused op norms each head; OLMo 2's norms span them all

    def make_qk_norm(self, layer_id: int, attention: Any) -> None:
        attrs = self.attention_attrs
        for kind, size in (("q", self.q_size), ("k", self.kv_size)):
            name = f"/model/layers.{layer_id}/attn/{kind}_norm/SimplifiedLayerNormalization"
            weight = f"model.layers.{layer_id}.attn.{kind}_norm.layernorm.weight"
            self.make_initializer(getattr(attention, f"{kind}_norm").weight, weight,
                                  to=self.io_dtype)  # fmt: skip
            output = f"{name}/output_0"
            self.make_node("SimplifiedLayerNormalization", inputs=[attrs[f"{kind}_path"], weight],
                           outputs=[output], name=name, axis=-1, stash_type=1,
                           epsilon=self.layernorm_attrs["epsilon"])  # fmt: skip
            self.make_value(output, self.io_dtype, shape=["batch_size", "sequence_length", size])
            attrs[f"{kind}_path"] = output

    def make_layer(self, layer_id: int, layer: Any) -> None:
        norms = self.layernorm_attrs
        self.make_attention(layer_id, layer.self_attn, root_input=norms["root_input"])
        if layer_id == self.num_layers - 1 and self.prunes_hidden_rows():
            self.make_selected_hidden_rows()
        self._post_norm(layer_id, layer.post_attention_layernorm, "post_attention")
        self._residual(layer_id, "attn")
        self.make_mlp(layer_id, layer.mlp, root_input=norms["root_input"])
        self._post_norm(layer_id, layer.post_feedforward_layernorm, "post_feedforward")
        norms["first_layernorm"] = False
        if layer_id < self.num_layers - 1:
            self._residual(layer_id, "mlp")
        else:  # the final norm's SkipLayerNorm adds the last one
            norms["skip_input"] = norms["output_0"]
            norms["last_layernorm"] = True

    def _post_norm(self, layer_id: int, norm: Any, location: str) -> None:
        """The norm of the sublayer's output (``skip_input``), the stream left as it was."""
        norms = self.layernorm_attrs
        stream = norms["root_input"]
        norms["root_input"] = norms["skip_input"]
        self.make_layernorm(layer_id, norm, skip=False, simple=True, location=location)
        norms["root_input"] = stream

    def _residual(self, layer_id: int, sublayer: str) -> None:
        """The stream plus the normed output, the stream from now on."""
        norms = self.layernorm_attrs
        name = f"/model/layers.{layer_id}/{sublayer}_residual/Add"
        self.make_add(name, [norms["root_input"], norms["output_0"]], dtype=self.io_dtype,
                      shape=self.make_hidden_state_shape())  # fmt: skip
        norms["root_input"] = norms["skip_input"] = f"{name}/output_0"


def renamed(config: Any) -> Any:
    """``config`` with OLMo 2's architecture under OLMo's name, which the dispatch knows."""
    if list(getattr(config, "architectures", None) or ()) == ["Olmo2ForCausalLM"]:
        config.architectures = ["OlmoForCausalLM"]
    return config
