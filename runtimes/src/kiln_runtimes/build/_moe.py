"""Mixtral, Qwen2-MoE (Qwen1.5-MoE), Qwen3-MoE, Granite 3's MoE, OLMoE, ERNIE 4.5's MoE, GLM-4.5,
HunYuan's MoE, MiniMax-M2 and dots.llm1 for the onnxruntime-genai builder, which has none of
them: each is a dense decoder it builds (Mistral's, Qwen2's, Qwen 3's, Granite's, Llama's layer
with OLMo 2's Q/K norms, ERNIE 4.5's, Llama's, HunYuan's) with :mod:`._experts`' sparse block.
The builder's dispatch knows the dense ones' names: these configs are read under them
(``_kilns.HOSTS``, ``_builder.read_config``) and ``_builder.by_model_type`` builds these
classes in their place.
"""

from __future__ import annotations

import importlib
from typing import Any

import onnx_ir as ir
import onnxruntime_genai.models  # noqa: F401 (puts the builder's own folder on sys.path)
import torch
from onnx_ir.tensor_adapters import to_torch_dtype

from kiln_runtimes.build._experts import Experts
from kiln_runtimes.build._olmo2 import Clipped, Olmo2
from kiln_runtimes.build._options import BuildError
from kiln_runtimes.build._positions import HunYuan

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


class Chosen(Experts, builders.Model):  # type: ignore[misc]
    """Experts chosen in the graph, not by the ``MoE`` node's own top k: it is fed the chosen
    experts' values and :data:`SENTINEL` for the rest, so its softmax over its top k is the
    chosen values' softmax, renormalized."""

    SENTINEL = -10000.0
    """The value given the experts not chosen: the node's softmax gives them nothing."""

    def __init__(self, config: Any, *args: Any) -> None:
        super().__init__(config, *args)
        self.moe_attrs["normalize_routing_weights"] = True
        shared = getattr(config, "moe_num_shared_experts", None)  # ERNIE's; GLM's below
        shared = shared or getattr(config, "n_shared_experts", None) or 0
        self.shared_expert_intermediate_size = self.moe_intermediate_size * shared

    def make_choice(self, name: str, scores: str, bias: Any) -> str:
        """The top k of ``scores`` plus the router's correction ``bias``: their indices."""
        k, rows = self.moe_attrs["top_k"], self.make_moe_router_shape()
        self.make_initializer(bias.reshape(-1), f"{name}.correction_bias", to=self.io_dtype)
        self.make_add(f"{name}/Add", [scores, f"{name}.correction_bias"], self.io_dtype, rows)
        self.make_topk(f"{name}/TopK", [f"{name}/Add/output_0", f"/model/constants/INT64/[{k}]"],
                       self.io_dtype, self.make_moe_router_shape(last_dim=k))  # fmt: skip
        return f"{name}/TopK/output_1"

    def make_chosen(self, name: str, full: str, indices: str, values: str) -> str:
        """``values`` at the chosen ``indices`` of a tensor shaped as ``full``, the sentinel
        elsewhere."""
        rows = self.make_moe_router_shape()
        self.make_shape(f"{name}/Shape", full, [2])
        sentinel = ir.tensor([self.SENTINEL], dtype=self.io_dtype)
        self.make_constant_of_shape(f"{name}/ConstantOfShape", f"{name}/Shape/output_0",
                                    sentinel, self.io_dtype, rows)  # fmt: skip
        scattered = [f"{name}/ConstantOfShape/output_0", indices, values]
        self.make_scatter_elements(f"{name}/ScatterElements", scattered, self.io_dtype, rows,
                                   axis=1)  # fmt: skip
        return f"{name}/ScatterElements/output_0"


class ErnieMoe(Chosen, builders.ErnieModel):  # type: ignore[misc]
    """ERNIE 4.5's MoE (21B-A3B, 300B-A47B): the builder's ERNIE 4.5 decoder, sparse blocks
    beside shared experts, whose experts are chosen on the router's softmax plus a correction
    bias (``moe_statics``) but mixed on the softmax alone, renormalized."""

    def make_selection(self, layer_id: int, moe: Any, logits: str) -> str:
        name = f"/model/layers.{layer_id}/moe/router"
        k, rows = self.moe_attrs["top_k"], self.make_moe_router_shape()
        self.make_softmax(f"{name}/Softmax", logits, self.io_dtype, rows)
        bias = moe.gate.moe_statics.e_score_correction_bias
        indices = self.make_choice(name, f"{name}/Softmax/output_0", bias)
        self.make_gather_elements(f"{name}/GatherElements", [logits, indices], self.io_dtype,
                                  self.make_moe_router_shape(last_dim=k), axis=1)  # fmt: skip
        return self.make_chosen(name, logits, indices, f"{name}/GatherElements/output_0")


class Sigmoided(Chosen):
    """Experts chosen on the router's sigmoid plus a correction bias and mixed on the chosen
    sigmoids alone, renormalized (GLM-4.5's, MiniMax-M2's)."""

    def correction_bias(self, moe: Any) -> Any:
        """The sparse block's correction bias (``[experts]``)."""
        return moe.gate.e_score_correction_bias

    def make_selection(self, layer_id: int, moe: Any, logits: str) -> str:
        """Log of the chosen experts' sigmoids: the node's softmax over them is their sigmoids,
        renormalized (clipped at the dtype's least normal number above zero, so none falls below
        the sentinel, in fp16 too)."""
        name = f"/model/layers.{layer_id}/moe/router"
        k, rows = self.moe_attrs["top_k"], self.make_moe_router_shape()
        chosen = self.make_moe_router_shape(last_dim=k)
        self.make_sigmoid(f"{name}/Sigmoid", logits, self.io_dtype, rows)
        scores = f"{name}/Sigmoid/output_0"
        tiny = torch.finfo(to_torch_dtype(self.io_dtype)).tiny
        indices = self.make_choice(name, scores, self.correction_bias(moe))
        self.make_gather_elements(f"{name}/GatherElements", [scores, indices], self.io_dtype,
                                  chosen, axis=1)  # fmt: skip
        self.make_clip(f"{name}/Clip", [f"{name}/GatherElements/output_0",
                       f"/model/constants/{self.to_str_dtype(self.io_dtype)}/{tiny}", ""],
                       self.io_dtype, chosen)  # fmt: skip
        self.make_log(f"{name}/Log", f"{name}/Clip/output_0", self.io_dtype, chosen)
        return self.make_chosen(name, logits, indices, f"{name}/Log/output_0")


class Glm4Moe(Sigmoided, builders.LlamaModel):  # type: ignore[misc]
    """GLM-4.5, 4.6 and 4.7 (``Glm4MoeForCausalLM``): Llama's decoder with Q/K/V biases, RoPE
    on half of each head, Qwen 3's per-head Q/K norms if ``use_qk_norm``; sparse blocks after
    ``first_k_dense_replace`` dense layers, beside shared experts, their sum times
    ``routed_scaling_factor``."""

    def __init__(self, config: Any, *args: Any) -> None:
        if (config.n_group or 1) > 1:
            raise BuildError("GLM-4.5's experts chosen by group (n_group > 1) are not built",
                             file="config.json", field="n_group")  # fmt: skip
        if not config.norm_topk_prob:
            raise BuildError("GLM-4.5's experts mixed without renormalizing are not built",
                             file="config.json", field="norm_topk_prob")  # fmt: skip
        super().__init__(config, *args)
        self.routed_scaling = float(config.routed_scaling_factor)

    def make_attention_init(self, config: Any) -> None:
        self.attention_attrs["q_norm"] = self.attention_attrs["k_norm"] = bool(config.use_qk_norm)
        super().make_attention_init(config)


class Dots1(Glm4Moe):
    """rednote's dots.llm1 (``Dots1ForCausalLM``): GLM-4.5's sparse blocks, routing and shared
    experts on Qwen 3's decoder (per-head Q/K norms, RoPE on whole heads)."""

    def make_attention_init(self, config: Any) -> None:
        config.use_qk_norm = True  # Qwen 3's per-head norms, always (its config has no flag)
        super().make_attention_init(config)


class MiniMaxM2(Sigmoided, Olmo2):
    """MiniMax-M2 (``MiniMaxM2ForCausalLM``, M2 to M2.5): Llama's layer with OLMo 2's Q/K
    RMSNorms across all heads and RoPE on part of each head, a sparse block in every layer (its
    correction bias kept on the block, not its router)."""

    make_layer = builders.Model.make_layer  # pre-norms (not OLMo 2's post-norms)

    def correction_bias(self, moe: Any) -> Any:
        return moe.e_score_correction_bias


class HunYuanMoe(Experts, HunYuan):
    """Tencent's HunYuan MoE (Hunyuan-A13B): HunYuan's dense decoder (its RoPE outside attention,
    on positions read from the mask), a sparse block in every layer beside a shared MLP."""

    def __init__(self, config: Any, *args: Any) -> None:
        for field in ("moe_topk", "num_experts"):  # one value, or one a layer
            values = getattr(config, field)
            if isinstance(values, list):
                if len(set(values)) != 1:
                    raise BuildError(f"HunYuan with a different {field} per layer is not built",
                                     file="config.json", field=field)  # fmt: skip
                setattr(config, field, values[0])
        super().__init__(config, *args)
        self.moe_attrs["normalize_routing_weights"] = True
        self.shared_expert_intermediate_size = config.intermediate_size


MODEL_TYPES = {"mixtral": Mixtral, "qwen3_moe": Qwen3Moe, "qwen2_moe": Qwen2Moe,
               "granitemoe": GraniteMoe, "olmoe": Olmoe, "ernie4_5_moe": ErnieMoe,
               "glm4_moe": Glm4Moe, "hunyuan_v1_moe": HunYuanMoe,
               "minimax_m2": MiniMaxM2, "dots1": Dots1}  # fmt: skip
