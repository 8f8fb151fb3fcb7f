"""LG's EXAONE 4.0 for the onnxruntime-genai builder, which does not know it
(``Exaone4ForCausalLM``): OLMo 2's layer (an RMSNorm of each sublayer's output before the
residual add, none before) with Qwen 3's Q/K norms (an RMSNorm of each head, the builder's own
``make_qk_norm``); with a sliding window (32B's), its ``sliding_attention`` layers slide it and
turn with RoPE and its ``full_attention`` layers attend globally without RoPE, as transformers
runs them. Read under OLMo's name (``_kilns.HOSTS``) and built by ``model_type``.
"""

from __future__ import annotations

import importlib
from typing import Any

import onnxruntime_genai.models  # noqa: F401 (puts the builder's own folder on sys.path)

from kiln_runtimes.build import _rope
from kiln_runtimes.build._olmo2 import Olmo2

builders: Any = importlib.import_module("builders")


class Exaone4(Olmo2):
    """EXAONE 4.0's decoder: post-norms, per-head Q/K norms, global layers without RoPE."""

    window_size: int | None
    make_qk_norm = builders.Model.make_qk_norm
    is_fused_qk_norm_gqa_supported = builders.Model.is_fused_qk_norm_gqa_supported

    def make_attention(self, layer_id: int, attention: Any, root_input: str, **kwargs: Any) -> None:
        hybrid = self.window_size is not None and self.window_size > 0
        with _rope.without(self, rope=hybrid and self.layer_types[layer_id] == "full_attention"):
            super().make_attention(layer_id, attention, root_input, **kwargs)


MODEL_TYPES = {"exaone4": Exaone4}
