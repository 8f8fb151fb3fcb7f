"""Swiss AI's Apertus for the onnxruntime-genai builder, which does not know it
(``ApertusForCausalLM``): Llama's layer (its norms named ``attention_layernorm`` and
``feedforward_layernorm``) with Qwen 3's per-head Q/K RMSNorms (the builder's own
``make_qk_norm``) and Nemotron's ungated MLP (``up_proj``, activation, ``down_proj``) through
xIELU, a trained activation no ONNX operator is: :meth:`Apertus.make_activation` spells it out
as transformers computes it, ``alpha_p * x² + beta * x`` where ``x > 0``, else
``(expm1(min(x, eps)) - x) * alpha_n + beta * x``, each layer's own ``alpha_p = softplus(a_p)``
and ``alpha_n = beta + softplus(a_n)``. Read under Llama's name (``_kilns.HOSTS``).
"""

from __future__ import annotations

import importlib
from types import SimpleNamespace
from typing import Any

import onnx_ir as ir
import onnxruntime_genai.models  # noqa: F401 (puts the builder's own folder on sys.path)
import torch

from kiln_runtimes.build._nodes import make_labelled

builders: Any = importlib.import_module("builders")


class Apertus(builders.LlamaModel):  # type: ignore[misc]
    """Apertus' decoder: per-head Q/K norms, an ungated xIELU MLP."""

    def __init__(self, config: Any, *args: Any) -> None:
        super().__init__(config, *args)
        self.attention_attrs["q_norm"] = self.attention_attrs["k_norm"] = True
        self.attention_attrs["use_packed_matmul"] = False
        self.mlp_attrs["fuse_gate_up"] = False  # no gate to fuse
        self.xielu: Any = None

    make_mlp_proj = builders.NemotronModel.make_mlp_proj

    def make_layer(self, layer_id: int, layer: Any) -> None:
        super().make_layer(layer_id, SimpleNamespace(
            input_layernorm=layer.attention_layernorm, self_attn=layer.self_attn,
            post_attention_layernorm=layer.feedforward_layernorm, mlp=layer.mlp,
        ))  # fmt: skip

    def make_mlp(self, layer_id: int, mlp: Any, root_input: str) -> None:
        self.xielu = mlp.act_fn  # this layer's trained activation
        super().make_mlp(layer_id, mlp, root_input)

    def make_activation(self, layer_id: int, root_input: str) -> str:
        act, softplus = self.xielu, torch.nn.functional.softplus
        beta = float(act.beta)
        values = {"ap": float(softplus(act.alpha_p.float())), "beta": beta, "one": 1.0,
                  "an": beta + float(softplus(act.alpha_n.float())), "eps": float(act.eps),
                  "zero": 0.0}  # fmt: skip
        const = {k: f"/model/constants/{self.to_str_dtype(self.io_dtype)}/{v!r}"
                 for k, v in values.items()}  # fmt: skip
        name, x = f"/model/layers.{layer_id}/mlp/act_fn", root_input
        # op, node, inputs (":X": node X's output)
        nodes = (
            ("Mul", "Square", [x, x]), ("Mul", "Quadratic", [":Square", const["ap"]]),
            ("Mul", "Linear", [x, const["beta"]]), ("Add", "Positive", [":Quadratic", ":Linear"]),
            ("Min", "Capped", [x, const["eps"]]), ("Exp", "Exp", [":Capped"]),
            ("Sub", "Expm1", [":Exp", const["one"]]), ("Sub", "Less", [":Expm1", x]),
            ("Mul", "Scaled", [":Less", const["an"]]), ("Add", "Negative", [":Scaled", ":Linear"]),
            ("Greater", "Above", [x, const["zero"]]),
            ("Where", "Where", [":Above", ":Positive", ":Negative"]),
        )  # fmt: skip
        shape = ["batch_size", "sequence_length", self.intermediate_size]
        for op, node, inputs in nodes:
            dtype = ir.DataType.BOOL if op == "Greater" else self.io_dtype
            make_labelled(self, name, node, op, inputs, dtype=dtype, dims=shape)
        return f"{name}/Where"

    intermediate_size: int


MODEL_TYPES = {"apertus": Apertus}
