"""Mixtral and Qwen3-MoE for the onnxruntime-genai builder, which has neither
(``MixtralForCausalLM``, ``Qwen3MoeForCausalLM``).

Both are a dense decoder (Mistral's, Qwen 3's) whose MLP is a sparse block: a router (``gate``,
no bias) scores every expert, the softmax's top ``num_experts_per_tok`` are kept, renormalized
to sum to one (Mixtral always; Qwen3-MoE if ``norm_topk_prob``), and each kept expert's SwiGLU
(``experts.gate_up_proj`` ``[E, 2I, H]``, ``experts.down_proj`` ``[E, H, I]``, as transformers 5
keeps them) is weighed by its score. ONNX Runtime's ``MoE`` operator does all of it: the
router's logits in, the weighted sum out. Qwen3-MoE's ``mlp_only_layers`` (and the layers
``decoder_sparse_step`` skips) keep a dense MLP of ``intermediate_size``. The builder's
dispatch knows Mistral's and Qwen 3's names: their configs are read under them
(``_builder.HOSTS``) and ``_builder.by_model_type`` builds these classes.
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
        builders.Qwen35MoETextModel.make_moe_router(self, layer_id, moe, root_input)

    def make_moe_subgraph(self, layer_id: int, moe: Any, root_input: str) -> None:
        names = builders.Model.make_moe_expert_names(self, layer_id)
        name = f"/model/layers.{layer_id}/moe/{self.moe_attrs['op_type']}"
        quantized = self.moe_attrs["op_type"] == "QMoE"
        builders.Model.make_moe_op(
            self, name, root_input=root_input,
            router_probs=f"/model/layers.{layer_id}/moe/router/Reshape/output_0",
            weight1=names["gate_up_weight"], bias1=names["gate_up_bias"],
            scales1=names["gate_up_scales"] if quantized else "",
            weight2=names["down_weight"], bias2=names["down_bias"],
            scales2=names["down_scales"] if quantized else "",
        )  # fmt: skip
        self.layernorm_attrs["skip_input"] = f"{name}/output_0"

    layernorm_attrs: dict[str, Any]


class Mixtral(Experts, builders.MistralModel):  # type: ignore[misc]
    """Mixtral: Mistral's decoder, a sparse block in every layer."""


class Qwen3Moe(Experts, builders.Qwen3Model):  # type: ignore[misc]
    """Qwen3-MoE: Qwen 3's decoder (per-head Q/K norms), sparse blocks."""


MODEL_TYPES = {"mixtral": Mixtral, "qwen3_moe": Qwen3Moe}
HOSTS = {"MixtralForCausalLM": "MistralForCausalLM", "Qwen3MoeForCausalLM": "Qwen3ForCausalLM"}
"""The builder's names these are read under."""
