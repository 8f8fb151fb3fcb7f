"""A mixture-of-experts block for the onnxruntime-genai builder's dense decoders (:mod:`._moe`).

A sparse block's router (``gate``, Granite's ``router``; no bias) scores every expert, the
softmax's top ``num_experts_per_tok`` are kept, renormalized to sum to one if the config says
so (``norm_topk_prob``; Mixtral's and Granite's always), and each kept expert's SwiGLU
(``experts.gate_up_proj`` ``[E, 2I, H]``, ``experts.down_proj`` ``[E, H, I]``, as transformers 5
keeps them) is weighed by its score. ONNX Runtime's ``MoE`` operator does all of it (``QMoE``
at int4/int8): the router's logits in, the weighted sum out (a decoder that chooses its experts
otherwise feeds it the chosen experts' logits alone, :meth:`Experts.make_selection`). A shared
expert (Qwen2-MoE's) joins through its sigmoid gate, shared experts (ERNIE 4.5's, GLM-4.5's,
HunYuan's) as they are. Layers whose MLP is dense (``mlp_only_layers``) keep it, at
``intermediate_size``.
"""

from __future__ import annotations

import importlib
from typing import Any

import onnxruntime_genai.models  # noqa: F401 (puts the builder's own folder on sys.path)

builders: Any = importlib.import_module("builders")


class Experts:
    """The sparse block as one ``MoE`` node, mixed into a dense decoder's builder."""

    intermediate_size: int
    moe_attrs: dict[str, Any]

    def __init__(self, config: Any, *args: Any) -> None:
        super().__init__(config, *args)  # type: ignore[call-arg]
        self.moe_attrs.update(activation_type="swiglu", swiglu_fusion=1)
        self.moe_attrs["normalize_routing_weights"] = getattr(config, "norm_topk_prob", True)
        self.moe_intermediate_size = getattr(
            config, "moe_intermediate_size", config.intermediate_size
        )
        self.dense_intermediate_size = config.intermediate_size

    def get_moe_module(self, layer_id: int, layer: Any) -> Any:
        return layer.mlp

    def make_moe(self, layer_id: int, moe: Any, root_input: str) -> None:
        if hasattr(moe, "experts"):
            builders.Model.make_moe(self, layer_id, moe, root_input)
            return
        sparse, self.intermediate_size = self.intermediate_size, self.dense_intermediate_size
        try:  # a dense layer among sparse ones
            builders.Model.make_mlp(self, layer_id, moe, root_input)
        finally:
            self.intermediate_size = sparse

    def make_moe_preprocessing(self, layer_id: int, moe: Any, root_input: str) -> None:
        builders.Model.make_interleaved_swiglu_moe_preprocessing(self, layer_id, moe)

    def make_moe_router(self, layer_id: int, moe: Any, root_input: str) -> None:
        router = moe.router if hasattr(moe, "router") else moe.gate  # Granite's, the others'
        router = getattr(router, "wg", router)  # HunYuan's gate keeps its linear layer there
        name = f"/model/layers.{layer_id}/moe/router"
        logits = builders.Model.make_matmul(self, router, f"{name}/MatMul", root_input)
        builders.Model.make_reshape(
            self, f"{name}/Reshape",
            [f"{logits}/output_0", f"/model/constants/INT64/{[-1, self.moe_attrs['num_experts']]}"],
            dtype=self.io_dtype, shape=builders.Model.make_moe_router_shape(self),
        )  # fmt: skip
        self.router_probs = self.make_selection(layer_id, moe, f"{name}/Reshape/output_0")

    def make_selection(self, layer_id: int, moe: Any, logits: str) -> str:
        """What the ``MoE`` node routes on (the top k of its softmax): the router's logits."""
        return logits

    def make_moe_subgraph(self, layer_id: int, moe: Any, root_input: str) -> None:
        names = builders.Model.make_moe_expert_names(self, layer_id)
        name = f"/model/layers.{layer_id}/moe/{self.moe_attrs['op_type']}"
        quantized = self.moe_attrs["op_type"] == "QMoE"
        builders.Model.make_moe_op(
            self, name, root_input=root_input,
            router_probs=self.router_probs,
            weight1=names["gate_up_weight"], bias1=names["gate_up_bias"],
            scales1=names["gate_up_scales"] if quantized else "",
            weight2=names["down_weight"], bias2=names["down_bias"],
            scales2=names["down_scales"] if quantized else "",
        )  # fmt: skip
        routed = f"{name}/output_0"
        if self.routed_scaling != 1.0:  # GLM-4.5's weights, times a constant
            scale = f"/model/constants/{self.to_str_dtype(self.io_dtype)}/{self.routed_scaling}"
            self.make_mul(f"{name}/Scale", [routed, scale], dtype=self.io_dtype,
                          shape=self.make_hidden_state_shape())  # fmt: skip
            routed = f"{name}/Scale/output_0"
        self.layernorm_attrs["skip_input"] = self.make_shared(layer_id, moe, root_input, routed)

    def make_shared(self, layer_id: int, moe: Any, root_input: str, routed: str) -> str:
        """The block's output: the routed experts' plus any shared expert's."""
        added = f"/model/layers.{layer_id}/moe/SharedAdd"
        if hasattr(moe, "shared_expert"):  # Qwen2-MoE's, gated by a sigmoid
            shared, gate = builders.Qwen35MoETextModel.make_shared_expert(
                self, layer_id, moe.shared_expert, moe.shared_expert_gate, root_input
            )
            self.make_gated_add(added, routed, shared, gate, shape=self.make_hidden_state_shape())
            return f"{added}/output_0"
        shared = getattr(moe, "shared_experts", None) or getattr(moe, "shared_mlp", None)
        if shared is None:
            return routed
        # ERNIE 4.5's, GLM-4.5's and HunYuan's, added as they are
        dense, self.intermediate_size = self.intermediate_size, self.shared_expert_intermediate_size
        try:
            builders.Model.make_mlp_proj(self, layer_id, shared, root_input)
        finally:
            self.intermediate_size = dense
        self.make_add(added, [routed, self.mlp_attrs["output_0"]], dtype=self.io_dtype,
                      shape=self.make_hidden_state_shape())  # fmt: skip
        return f"{added}/output_0"

    io_dtype: Any
    layernorm_attrs: dict[str, Any]
    mlp_attrs: dict[str, Any]
    router_probs: str
    routed_scaling = 1.0
    """What the routed experts' sum is multiplied by (GLM-4.5's ``routed_scaling_factor``)."""
    shared_expert_intermediate_size: int
    make_add: Any
    make_mul: Any
    make_gated_add: Any
    to_str_dtype: Any
    make_hidden_state_shape: Any
