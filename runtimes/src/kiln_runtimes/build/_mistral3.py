"""Mistral 3's text decoder (``Mistral3ForConditionalGeneration``: Mistral Small 3.1/3.2,
Ministral 3, Magistral), which the onnxruntime-genai builder exports without Ministral 3's
attention temperature: transformers scales each query by ``1 + beta * log(1 + floor(p / n))``
at position ``p`` (``llama_4_scaling_beta``, ``n`` its ``original_max_position_embeddings``), so
a build without it answers unlike its source past ``n`` positions. :class:`Mistral3` scales it
in the graph, the positions read from the attention mask (:func:`._positions.make_positions`), and
so does :class:`Ministral3` for its text-only checkpoints (``Ministral3ForCausalLM``, read under
Mistral's name).
"""

from __future__ import annotations

import importlib
from typing import Any

import onnx_ir as ir
import onnxruntime_genai.models  # noqa: F401 (puts the builder's own folder on sys.path)

from kiln_runtimes.build._nodes import make_labelled
from kiln_runtimes.build._positions import make_positions

builders: Any = importlib.import_module("builders")
SCALE = "/model/attn_temperature"


class Tempered(builders.Model):  # type: ignore[misc]
    """A decoder whose queries' temperature rises past the original context, if configured."""

    def __init__(self, config: Any, *args: Any) -> None:
        super().__init__(config, *args)
        rope = getattr(config, "rope_parameters", None) or {}
        self.beta = float(rope.get("llama_4_scaling_beta") or 0.0)
        self.span = float(rope.get("original_max_position_embeddings") or 1.0)
        if self.beta:  # the queries their own path, to scale them alone
            self.attention_attrs["use_packed_matmul"] = False

    def make_attention_qk_norm(self, layer_id: int, attention: Any) -> None:
        super().make_attention_qk_norm(layer_id, attention)
        if not self.beta:
            return
        if layer_id == 0:
            self.make_temperature()
        attrs, name = self.attention_attrs, f"/model/layers.{layer_id}/attn/q_temperature/Mul"
        self.make_mul(name, [attrs["q_path"], f"{SCALE}/Cast/output_0"], self.io_dtype,
                      ["batch_size", "sequence_length", self.q_size])  # fmt: skip
        attrs["q_path"] = f"{name}/output_0"

    def make_temperature(self) -> None:
        """``[batch, sequence, 1]``: each new token's query scale, once for every layer."""
        positions = make_positions(self, f"{SCALE}/positions")
        span, beta = (f"/model/constants/FLOAT/{v}" for v in (self.span, self.beta))
        one, rows = "/model/constants/FLOAT/1.0", ["batch_size", "sequence_length"]
        # op, inputs (":X": node X's output), attributes
        nodes: tuple[tuple[str, list[str], dict[str, Any]], ...] = (
            ("ToFloat", [positions], {"to": ir.DataType.FLOAT}),
            ("Div", [":ToFloat", span], {}),
            ("Floor", [":Div"], {}),
            ("Log1p", [":Floor", one], {}),
            ("Log", [":Log1p"], {}),
            ("Mul", [":Log", beta], {}),
            ("Scale", [":Mul", one], {}),
            ("Unsqueeze", [":Scale", "/model/constants/INT64/[-1]"], {}),
            ("Cast", [":Unsqueeze"], {"to": self.io_dtype}),
        )
        for op, inputs, attrs in nodes:
            kind = {"ToFloat": "Cast", "Log1p": "Add", "Scale": "Add"}.get(op, op)
            dtype = self.io_dtype if op == "Cast" else ir.DataType.FLOAT
            dims = [*rows, 1] if op in ("Unsqueeze", "Cast") else rows
            make_labelled(self, SCALE, op, kind, inputs, dtype=dtype, dims=dims, **attrs)


class Mistral3(Tempered, builders.Mistral3TextModel):  # type: ignore[misc]
    """The builder's Mistral 3 text decoder (of a vision checkpoint), tempered."""


class Ministral3(Tempered, builders.MistralModel):  # type: ignore[misc]
    """Ministral 3's text-only decoder: Mistral's, tempered."""


MODEL_TYPES = {"ministral3": Ministral3}
