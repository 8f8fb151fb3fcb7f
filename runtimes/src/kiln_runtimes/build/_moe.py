"""Mixtral, Qwen2-MoE (Qwen1.5-MoE), Qwen3-MoE, Granite 3's MoE, OLMoE and ERNIE 4.5's MoE for
the onnxruntime-genai builder, which has none of them: each is a dense decoder it builds
(Mistral's, Qwen2's, Qwen 3's, Granite's, Llama's layer with OLMo 2's Q/K norms, ERNIE 4.5's)
with :mod:`._experts`' sparse block. The builder's dispatch knows the dense ones' names: these
configs are read under them (``_kilns.HOSTS``, ``_builder.read_config``) and
``_builder.by_model_type`` builds these classes in their place.
"""

from __future__ import annotations

import importlib
from typing import Any

import onnx_ir as ir
import onnxruntime_genai.models  # noqa: F401 (puts the builder's own folder on sys.path)

from kiln_runtimes.build._experts import Experts
from kiln_runtimes.build._olmo2 import Clipped, Olmo2

builders: Any = importlib.import_module("builders")


class Mixtral(Experts, builders.MistralModel):  # type: ignore[misc]
    """Mixtral: Mistral's decoder, a sparse block in every layer."""


class Qwen3Moe(Experts, builders.Qwen3Model):  # type: ignore[misc]
    """Qwen3-MoE: Qwen 3's decoder (per-head Q/K norms), sparse blocks."""


class Qwen2Moe(Experts, builders.QwenModel):  # type: ignore[misc]
    """Qwen2-MoE (Qwen1.5-MoE): Qwen2's decoder, sparse blocks with a gated shared expert."""

    def __init__(self, config: Any, *args: Any) -> None:
        super().__init__(config, *args)
        self.shared_expert_intermediate_size = config.shared_expert_intermediate_size


class GraniteMoe(Experts, builders.GraniteModel):  # type: ignore[misc]
    """Granite 3's MoE: Granite's multipliers, its sparse block ``block_sparse_moe``."""

    def make_layer(self, layer_id: int, layer: Any) -> None:
        object.__setattr__(layer, "mlp", layer.block_sparse_moe)  # where Granite's layer reads
        super().make_layer(layer_id, layer)

    def make_mlp(self, layer_id: int, mlp: Any, root_input: str) -> None:
        self.make_moe(layer_id, mlp, root_input)


class Olmoe(Experts, Clipped, Olmo2):
    """OLMoE: Llama's layer, OLMo 2's Q/K norms across heads, sparse blocks, ``clip_qkv``."""

    make_layer = builders.Model.make_layer  # pre-norms (not OLMo 2's post-norms)


class ErnieMoe(Experts, builders.ErnieModel):  # type: ignore[misc]
    """ERNIE 4.5's MoE (21B-A3B, 300B-A47B): the builder's ERNIE 4.5 decoder, sparse blocks
    beside shared experts, whose experts are chosen on the router's softmax plus a correction
    bias (``moe_statics``) but mixed on the softmax alone, renormalized."""

    SENTINEL = -10000.0
    """The logit given the experts not chosen: the node's softmax gives them nothing."""

    def __init__(self, config: Any, *args: Any) -> None:
        super().__init__(config, *args)
        self.moe_attrs["normalize_routing_weights"] = True
        shared = config.moe_num_shared_experts or 0
        self.shared_expert_intermediate_size = config.moe_intermediate_size * shared

    def make_selection(self, layer_id: int, moe: Any, logits: str) -> str:
        """The chosen experts' logits, the others' :data:`SENTINEL`: the node's softmax over its
        top k is then the chosen experts' softmax probabilities, renormalized, as ERNIE's."""
        name, k = f"/model/layers.{layer_id}/moe/router", self.moe_attrs["top_k"]
        bias = f"model.layers.{layer_id}.mlp.gate.moe_statics.e_score_correction_bias"
        self.make_initializer(moe.gate.moe_statics.e_score_correction_bias.reshape(-1), bias,
                              to=self.io_dtype)  # fmt: skip
        rows, chosen = self.make_moe_router_shape(), self.make_moe_router_shape(last_dim=k)
        self.make_softmax(f"{name}/Softmax", logits, self.io_dtype, rows)
        self.make_add(f"{name}/Add", [f"{name}/Softmax/output_0", bias], self.io_dtype, rows)
        self.make_topk(f"{name}/TopK", [f"{name}/Add/output_0", f"/model/constants/INT64/[{k}]"],
                       self.io_dtype, chosen)  # fmt: skip
        picked = [logits, f"{name}/TopK/output_1"]
        self.make_gather_elements(f"{name}/GatherElements", picked, self.io_dtype, chosen, axis=1)
        self.make_shape(f"{name}/Shape", logits, [2])
        sentinel = ir.tensor([self.SENTINEL], dtype=self.io_dtype)
        self.make_constant_of_shape(f"{name}/ConstantOfShape", f"{name}/Shape/output_0",
                                    sentinel, self.io_dtype, rows)  # fmt: skip
        scattered = [f"{name}/ConstantOfShape/output_0", f"{name}/TopK/output_1",
                     f"{name}/GatherElements/output_0"]  # fmt: skip
        self.make_scatter_elements(f"{name}/ScatterElements", scattered, self.io_dtype, rows,
                                   axis=1)  # fmt: skip
        return f"{name}/ScatterElements/output_0"


MODEL_TYPES = {"mixtral": Mixtral, "qwen3_moe": Qwen3Moe, "qwen2_moe": Qwen2Moe,
               "granitemoe": GraniteMoe, "olmoe": Olmoe, "ernie4_5_moe": ErnieMoe}  # fmt: skip
