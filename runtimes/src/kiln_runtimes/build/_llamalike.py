"""StableLM and Starcoder2 for the onnxruntime-genai builder, which has neither
(``StableLmForCausalLM``, ``Starcoder2ForCausalLM``).

Each is Llama's decoder with LayerNorms (weight and bias, at the config's epsilon) where Llama
has RMSNorms (:class:`LayerNormed`, :mod:`._cohere`'s too). StableLM keeps Llama's gated MLP and
turns a share of each head (``partial_rotary_factor``, a quarter) with RoPE; with
``use_parallel_residual`` its attention and MLP read the same norm's output and both join the
stream at once (Phi's layer). Starcoder2's MLP is ``c_fc``, a tanh GELU, ``c_proj``, each with
a bias (Phi's ``fc1``/``fc2``), its attention has biases, and a ``sliding_window`` is served as
Mistral's. Arcee's AFM is Llama with Nemotron's ungated ReLU² MLP, Kyutai's Helium Llama with
interleaved RoPE. StableLM 2 12B norms each head's query and key with its own LayerNorm
(``qk_layernorm``; :meth:`LayerNormed.make_qk_norm`, Command R+'s too). The builder's dispatch
knows Llama's name: their configs are read under it (``_builder.read_config``) and
``_builder.by_model_type`` builds these classes.
"""

from __future__ import annotations

import importlib
from types import SimpleNamespace
from typing import Any

import onnxruntime_genai.models  # noqa: F401 (puts the builder's own folder on sys.path)
import torch

builders: Any = importlib.import_module("builders")


class LayerNormed(builders.LlamaModel):  # type: ignore[misc]
    """Llama's decoder with LayerNorms (at the config's epsilon: ``_builder.read_epsilon``); if
    the config's ``qk_norms`` flag is on, each head's query and key are LayerNormed with that
    head's own scale (no shift) before RoPE."""

    qk_norms = ""

    def __init__(self, config: Any, *args: Any) -> None:
        super().__init__(config, *args)
        self.layernorm_attrs["simple"] = False
        if self.qk_norms and getattr(config, self.qk_norms, False):
            self.attention_attrs["q_norm"] = self.attention_attrs["k_norm"] = True
            self.attention_attrs["use_packed_matmul"] = False

    def is_fused_qk_norm_gqa_supported(self) -> bool:
        return False  # the fused op's norms are RMSNorms with one scale for every head

    def head_scales(self, attention: Any, kind: str) -> Any:
        """The ``kind`` (q or k) norms' scales, a row a head."""
        return getattr(attention, f"{kind}_norm").weight

    def make_qk_norm(self, layer_id: int, attention: Any) -> None:
        attrs, size = self.attention_attrs, self.head_size
        for kind, heads in (("q", self.num_attn_heads), ("k", self.num_kv_heads)):
            path, scales = f"/model/layers.{layer_id}/attn/{kind}_norm", f"model.layers.{layer_id}"
            split = ["batch_size", "sequence_length", heads, size]
            self.make_reshape(f"{path}/Reshape_1", [attrs[f"{kind}_path"],
                              f"/model/constants/INT64/[0, 0, {heads}, {size}]"],
                              self.io_dtype, split)  # fmt: skip
            unit = f"{scales}.attn.{kind}_norm.unit"
            self.make_initializer(torch.ones(size), unit, to=self.io_dtype)
            normed = f"{path}/LayerNormalization/output_0"
            self.make_node("LayerNormalization", [f"{path}/Reshape_1/output_0", unit], [normed],
                           name=f"{path}/LayerNormalization", axis=-1, stash_type=1,
                           epsilon=self.layernorm_attrs["epsilon"])  # fmt: skip
            self.make_value(normed, self.io_dtype, split)
            weight = f"{scales}.attn.{kind}_norm.layernorm.weight"
            self.make_initializer(self.head_scales(attention, kind), weight, to=self.io_dtype)
            self.make_mul(f"{path}/Mul", [normed, weight], self.io_dtype, split)
            self.make_reshape(f"{path}/Reshape_2", [f"{path}/Mul/output_0",
                              f"/model/constants/INT64/[0, 0, {heads * size}]"], self.io_dtype,
                              ["batch_size", "sequence_length", heads * size])  # fmt: skip
            attrs[f"{kind}_path"] = f"{path}/Reshape_2/output_0"


class StableLm(LayerNormed):
    """StableLM's decoder: LayerNorms, partial RoPE, the parallel residual if configured."""

    qk_norms = "qk_layernorm"

    def head_scales(self, attention: Any, kind: str) -> Any:
        return torch.stack([norm.weight for norm in getattr(attention, f"{kind}_layernorm").norms])

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


class Arcee(builders.LlamaModel):  # type: ignore[misc]
    """Arcee's AFM: Llama's decoder, Nemotron's MLP (``up_proj``, ReLU squared, ``down_proj``)."""

    def __init__(self, config: Any, *args: Any) -> None:
        super().__init__(config, *args)
        self.mlp_attrs["fuse_gate_up"] = False  # no gate to fuse

    make_mlp_proj = builders.NemotronModel.make_mlp_proj


class Helium(builders.LlamaModel):  # type: ignore[misc]
    """Kyutai's Helium: Llama's decoder, its RoPE turning interleaved pairs (Cohere's)."""

    def __init__(self, config: Any, *args: Any) -> None:
        super().__init__(config, *args)
        self.rope_attrs["interleaved"] = 1


MODEL_TYPES = {"stablelm": StableLm, "starcoder2": Starcoder2, "arcee": Arcee, "helium": Helium}
