"""Positions read from the attention mask, for decoders whose graph would take
``position_ids``: Kiln's runner (like GenAI's Generator for most models) feeds ``input_ids``,
``attention_mask`` and the KV cache only. Token ``i`` of a row of ``S`` new tokens is at
``sum(mask) - S + i``, which holds for what runs these graphs: a prefill is one row without
padding, a decode step one new token a row (:func:`make_positions`).

Learned position embeddings (``_learned``), Ministral 3's query temperature (``_mistral3``) and
RoPE turned outside the attention node (:class:`FromMask`: Qwen-VL's M-RoPE, ``_qwen_vl``;
HunYuan's, whose Q/K norms come after RoPE, :class:`HunYuan`) read them.
"""

from __future__ import annotations

import importlib
from typing import Any

import onnx_ir as ir
import onnxruntime_genai.models  # noqa: F401 (puts the builder's own folder on sys.path)

from kiln_runtimes.build._nodes import make_labelled

builders: Any = importlib.import_module("builders")
INT64 = "/model/constants/INT64"


def make_positions(model: Any, name: str) -> str:
    """Nodes under ``name`` computing the new tokens' positions, ``[batch, sequence]`` int64,
    from the attention mask (``sum(mask) - S + i`` for the ``i``th of ``S`` new tokens: Kiln's
    runner feeds no ``position_ids``); returns the output's name."""
    mask, ids = model.input_names["attention_mask"], model.input_names["input_ids"]
    # op, inputs (":X": node X's output), output shape, attributes
    nodes: tuple[tuple[str, list[str], list[Any], dict[str, Any]], ...] = (
        ("ReduceSum", [mask, f"{INT64}/[1]"], ["batch_size", 1], {"keepdims": 1}),
        ("Cast", [":ReduceSum"], ["batch_size", 1], {"to": ir.DataType.INT64}),
        ("Shape", [ids], [1], {"start": 1, "end": 2}),
        ("Sub", [":Cast", ":Shape"], ["batch_size", 1], {}),
        ("Squeeze", [":Shape"], [], {}),
        ("Range", [f"{INT64}/0", ":Squeeze", f"{INT64}/1"], ["sequence_length"], {}),
        ("Add", [":Sub", ":Range"], ["batch_size", "sequence_length"], {}),
    )
    for op, inputs, dims, attrs in nodes:
        output = make_labelled(model, name, op, op, inputs, dtype=ir.DataType.INT64, dims=dims,
                               **attrs)  # fmt: skip
    return output


class FromMask(builders.Model):  # type: ignore[misc]
    """A decoder whose RoPE nodes outside attention read the positions from the mask: no
    ``position_ids`` input, in the graph or ``genai_config.json``."""

    positions = ""
    """The positions' output, made before the first layer's RoPE."""

    def __init__(self, config: Any, *args: Any) -> None:
        super().__init__(config, *args)
        self.input_names.pop("position_ids", None)

    def make_attention_qk_rope(self, layer_id: int, **kwargs: Any) -> Any:
        self.positions = self.positions or self.make_mask_positions()
        self.input_names["position_ids"] = self.positions  # what RoPE reads
        try:
            return super().make_attention_qk_rope(layer_id, **kwargs)
        finally:  # never a graph input, nor one genai_config.json names
            del self.input_names["position_ids"]

    def make_mask_positions(self) -> str:
        """``[batch, sequence]``: each new token's position."""
        return make_positions(self, "/model/positions")


class HunYuan(FromMask, builders.HunyuanDenseV1Model):  # type: ignore[misc]
    """Tencent's HunYuan dense decoder (Hunyuan-MT, Hunyuan 0.5B-7B): the builder's, whose Q/K
    RMSNorms after RoPE keep RoPE out of the attention node, its positions read from the mask."""
