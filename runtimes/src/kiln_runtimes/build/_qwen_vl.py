"""Qwen2.5-VL's, Qwen3-VL's and Qwen 3.5's text decoders (``Qwen2_5_VLForConditionalGeneration``,
``Qwen3VLForConditionalGeneration``, ``Qwen3_5ForConditionalGeneration`` and its MoE), which
the onnxruntime-genai builder exports taking ``position_ids`` in three sections (time, height,
width: M-RoPE). Kiln's runner feeds no positions, and for text all three sections are the
token's position, so :class:`Sectioned` reads it from the attention mask
(:class:`._positions.FromMask`) and stacks it thrice.
"""

from __future__ import annotations

import importlib
from typing import Any

import onnx_ir as ir
import onnxruntime_genai.models  # noqa: F401 (puts the builder's own folder on sys.path)

from kiln_runtimes.build._positions import FromMask, make_positions

builders: Any = importlib.import_module("builders")
POSITIONS = "/model/mrope_positions"


class Sectioned(FromMask):
    """An M-RoPE decoder whose text positions are read from the mask, not fed."""

    def make_mask_positions(self) -> str:
        """``[3, batch, sequence]``: each new token's position, in every section."""
        positions = make_positions(self, f"{POSITIONS}/positions")
        rows = ["batch_size", "sequence_length"]
        unsqueezed = f"{POSITIONS}/Unsqueeze/output_0"
        self.make_node("Unsqueeze", [positions, "/model/constants/INT64/[0]"], [unsqueezed],
                       name=f"{POSITIONS}/Unsqueeze")  # fmt: skip
        self.make_value(unsqueezed, ir.DataType.INT64, [1, *rows])
        self.make_node("Concat", [unsqueezed] * 3, [f"{POSITIONS}/Concat/output_0"],
                       name=f"{POSITIONS}/Concat", axis=0)  # fmt: skip
        self.make_value(f"{POSITIONS}/Concat/output_0", ir.DataType.INT64, [3, *rows])
        return f"{POSITIONS}/Concat/output_0"


class Qwen25VL(Sectioned, builders.Qwen25VLTextModel):  # type: ignore[misc]
    """Qwen2.5-VL's text decoder, its positions read from the mask."""


class Qwen3VL(Sectioned, builders.Qwen3VLTextModel):  # type: ignore[misc]
    """Qwen3-VL's text decoder, its positions read from the mask."""


class Qwen35Text(Sectioned, builders.Qwen35TextModel):  # type: ignore[misc]
    """Qwen 3.5's hybrid text decoder (Gated DeltaNet layers between attention layers), its
    positions read from the mask."""


class Qwen35MoeText(Sectioned, builders.Qwen35MoETextModel):  # type: ignore[misc]
    """Qwen 3.5's mixture-of-experts text decoder, its positions read from the mask."""


class Qwen35(builders.Qwen35Model):  # type: ignore[misc]
    """Qwen 3.5's composite builder (decoder and multi-token-prediction head), its decoder
    :class:`Qwen35Text`."""

    def get_decoder_model_class(self) -> Any:
        return Qwen35Text


class Qwen35Moe(builders.Qwen35MoEModel):  # type: ignore[misc]
    """Qwen 3.5 MoE's composite builder, its decoder :class:`Qwen35MoeText`."""

    def get_decoder_model_class(self) -> Any:
        return Qwen35MoeText
