"""Mixtral, Qwen2-MoE (Qwen1.5-MoE), Qwen3-MoE, Granite 3's MoE and OLMoE for the
onnxruntime-genai builder, which has none of them: each is a dense decoder it builds (Mistral's,
Qwen2's, Qwen 3's, Granite's, Llama's layer with OLMo 2's Q/K norms) with :mod:`._experts`' sparse
block. The builder's dispatch knows the dense ones' names: these configs are read under them
(``_kilns.HOSTS``, ``_builder.read_config``) and ``_builder.by_model_type`` builds these
classes in their place.
"""

from __future__ import annotations

import importlib
from typing import Any

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


MODEL_TYPES = {"mixtral": Mixtral, "qwen3_moe": Qwen3Moe, "qwen2_moe": Qwen2Moe,
               "granitemoe": GraniteMoe, "olmoe": Olmoe}  # fmt: skip
