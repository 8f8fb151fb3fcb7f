"""OLMo 2 and 3 for the onnxruntime-genai builder, which has neither (``Olmo2ForCausalLM``,
``Olmo3ForCausalLM``).

OLMo 2's layer is Llama's but for where its norms sit, as transformers runs it: none before
attention or the MLP, an RMSNorm of each one's output before it joins the residual stream
(``post_attention_layernorm``, ``post_feedforward_layernorm``), and RMSNorms of the whole query
and key projections (``q_norm``, ``k_norm``: across all heads, not per head as Qwen 3's and
Gemma 3's, so not the builder's own ``make_qk_norm``). The builder's dispatch knows OLMo's name
only: their configs are read under it (``_builder.read_config``), and
``_builder.by_model_type`` builds their classes. OLMo 3 is OLMo 2 with sliding windows on some
layers (:class:`Olmo3`). OLMo's and OLMoE's ``clip_qkv`` clamps the projections
(:class:`Clipped`).
"""

from __future__ import annotations

import importlib
from typing import Any

import onnxruntime_genai.models  # noqa: F401 (puts the builder's own folder on sys.path)
import torch

from kiln_runtimes.build._options import BuildError

builders: Any = importlib.import_module("builders")


class Clipped(builders.Model):  # type: ignore[misc]
    """Q, K and V clamped to ``±clip_qkv`` after their projections and norms, before RoPE, as
    OLMo (7B 0424) and OLMoE run them, if the config sets it."""

    def __init__(self, config: Any, *args: Any) -> None:
        super().__init__(config, *args)
        self.clip_qkv = getattr(config, "clip_qkv", None)
        if self.clip_qkv is not None:  # each projection its own path to clamp
            self.attention_attrs["use_packed_matmul"] = False

    def make_attention_qk_norm(self, layer_id: int, attention: Any) -> None:
        super().make_attention_qk_norm(layer_id, attention)
        if self.clip_qkv is None:
            return
        attrs, bounds = self.attention_attrs, f"model.layers.{layer_id}.attn.clip_qkv"
        for end, value in (("min", -self.clip_qkv), ("max", self.clip_qkv)):
            self.make_initializer(torch.tensor(value), f"{bounds}.{end}", to=self.io_dtype)
        for kind, size in (("q", self.q_size), ("k", self.kv_size), ("v", self.kv_size)):
            name = f"/model/layers.{layer_id}/attn/{kind}_clip/Clip"
            self.make_node("Clip", [attrs[f"{kind}_path"], f"{bounds}.min", f"{bounds}.max"],
                           [f"{name}/output_0"], name=name)  # fmt: skip
            self.make_value(f"{name}/output_0", self.io_dtype,
                            ["batch_size", "sequence_length", size])  # fmt: skip
            attrs[f"{kind}_path"] = f"{name}/output_0"


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


class Olmo3(Olmo2):
    """OLMo 3: OLMo 2's layer with sliding-window attention on the ``sliding_attention`` layers
    (``layer_types``), its RoPE given per layer type (transformers 5) and the same for both
    (OLMo 3's own configs); RoPE that differs between them is refused, not built wrong."""

    window_size: int

    def make_rope_init(self, config: Any) -> None:
        layered = getattr(config, "rope_parameters", None)
        if isinstance(layered, dict) and "full_attention" in layered:
            if layered["full_attention"] != layered.get(
                "sliding_attention", layered["full_attention"]
            ):
                raise BuildError("OLMo 3 with a different RoPE per layer type is not built",
                                 file="config.json", field="rope_parameters")  # fmt: skip
            config.rope_parameters = layered["full_attention"]
            self.rope_attrs["theta"] = layered["full_attention"]["rope_theta"]  # not read flat
        super().make_rope_init(config)

    def make_attention(self, layer_id: int, attention: Any, root_input: str, **kwargs: Any) -> None:
        window = self.window_size
        if self.layer_types[layer_id] == "full_attention":
            self.window_size = -1
        try:
            super().make_attention(layer_id, attention, root_input, **kwargs)
        finally:
            self.window_size = window
