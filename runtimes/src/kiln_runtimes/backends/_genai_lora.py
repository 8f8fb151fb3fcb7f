"""Adapter slots in a GenAI decoder graph, and the buffers behind them (``kiln_runtimes.lora``).

``patch`` rewrites each attention projection of the builder's graph, ``/model/layers.N/attn/
{qkv,q,k,v,o}_proj/MatMul[_Q4|_Q8]``, into ``y + ((x·A) ⊙ lora_mask)·B`` with ``A``/``B`` as graph
inputs. ``AdapterSlots`` owns those inputs' buffers (bound by address, written in place between
steps) and builds each run's mask.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from pathlib import Path

    import numpy.typing as npt
    import onnx

    from kiln_runtimes.lora import Adapter, Dims

MASK = "lora_mask"
_NODE = re.compile(
    r"^/model/layers\.(\d+)/attn/(qkv_proj|q_proj|k_proj|v_proj|o_proj)/MatMul(?:_Q4|_Q8)?$"
)


@dataclass(frozen=True)
class Target:
    """One patched projection: its ``(PEFT module, first output column, columns)`` parts."""

    layer: int
    node: str
    fan_in: int
    fan_out: int
    parts: tuple[tuple[str, int, int], ...]

    @property
    def a(self) -> str:
        return f"lora.layers.{self.layer}.{self.node}.A"

    @property
    def b(self) -> str:
        return f"lora.layers.{self.layer}.{self.node}.B"


def target(layer: int, node: str, dims: Dims) -> Target:
    """The projection ``node`` of ``layer``; the builder packs q, k and v into ``qkv_proj``."""
    if node == "qkv_proj":
        q, kv = dims.q_size, dims.kv_size
        parts = (("q_proj", 0, q), ("k_proj", q, kv), ("v_proj", q + kv, kv))
        return Target(layer, node, dims.hidden, q + 2 * kv, parts)
    fan_in, fan_out = dims.shape(node)
    return Target(layer, node, fan_in, fan_out, ((node, 0, fan_out),))


def patch(model_path: Path, dims: Dims, width: int) -> tuple[bytes, list[Target]]:
    """The graph with adapter inputs ``width`` (slots times rank) columns wide; the weights stay
    in the folder's external data file."""
    import onnx
    from onnx import helper

    model = onnx.load(str(model_path), load_external_data=False)
    graph = model.graph
    io_type = next(o.type.tensor_type.elem_type for o in graph.output if o.name == "logits")
    graph.input.append(helper.make_tensor_value_info(MASK, io_type, ["batch_size", 1, width]))
    nodes: list[onnx.NodeProto] = []
    targets: list[Target] = []
    for node in graph.node:
        nodes.append(node)
        match = _NODE.match(node.name)
        if match is None:
            continue
        found = target(int(match[1]), match[2], dims)
        _check_shape(node, graph, found)
        graph.input.append(helper.make_tensor_value_info(found.a, io_type, [found.fan_in, width]))
        graph.input.append(helper.make_tensor_value_info(found.b, io_type, [width, found.fan_out]))
        nodes.extend(_lora_nodes(node, found))
        targets.append(found)
    if len(targets) < dims.num_layers * 2:
        raise ValueError(
            f"found {len(targets)} attention projections to patch in {model_path.name}"
        )
    del graph.node[:]
    graph.node.extend(nodes)
    return model.SerializeToString(), targets


def _lora_nodes(node: onnx.NodeProto, found: Target) -> list[onnx.NodeProto]:
    """``y = base(x) + ((x·A) ⊙ mask)·B``; the base node now writes ``y/base``."""
    from onnx import helper

    out, x, name = node.output[0], node.input[0], f"/lora/layers.{found.layer}/{found.node}"
    node.output[0] = f"{out}/base"
    return [
        helper.make_node("MatMul", [x, found.a], [f"{name}/xa"], name=f"{name}/A"),
        helper.make_node("Mul", [f"{name}/xa", MASK], [f"{name}/masked"], name=f"{name}/Mask"),
        helper.make_node(
            "MatMul", [f"{name}/masked", found.b], [f"{name}/delta"], name=f"{name}/B"
        ),
        helper.make_node("Add", [f"{out}/base", f"{name}/delta"], [out], name=f"{name}/Add"),
    ]


def _check_shape(node: onnx.NodeProto, graph: onnx.GraphProto, found: Target) -> None:
    if node.op_type == "MatMulNBits":
        attrs = {a.name: a.i for a in node.attribute}
        shape = (attrs.get("K"), attrs.get("N"))
    else:
        weight = next((t for t in graph.initializer if t.name == node.input[1]), None)
        shape = tuple(weight.dims) if weight is not None else (None, None)
    if shape != (found.fan_in, found.fan_out):
        raise ValueError(
            f"{node.name} is {shape}, genai_config.json says {found.fan_in, found.fan_out}"
        )


class AdapterSlots:
    """The ``A``/``B`` buffers of every target, ``slots`` adapters of up to ``rank`` columns."""

    def __init__(self, targets: list[Target], slots: int, rank: int, dtype: Any) -> None:
        self.targets, self.slots, self.rank, self.dtype = targets, slots, rank, dtype
        width = slots * rank
        self.inputs: dict[str, npt.NDArray[Any]] = {}
        for t in targets:
            self.inputs[t.a] = np.zeros((t.fan_in, width), dtype=dtype)
            self.inputs[t.b] = np.zeros((width, t.fan_out), dtype=dtype)

    def load(self, slot: int, adapter: Adapter) -> None:
        """Write ``adapter`` into ``slot``'s columns; q, k and v of a packed target stack."""
        first = slot * self.rank
        for t in self.targets:
            a, b = self.inputs[t.a], self.inputs[t.b]
            a[:, first : first + self.rank] = 0
            b[first : first + self.rank] = 0
            column = first
            for module, start, size in t.parts:
                key = (t.layer, module)
                if key in adapter.a:
                    a[:, column : column + adapter.rank] = adapter.a[key]
                    b[column : column + adapter.rank, start : start + size] = adapter.b[key]
                    column += adapter.rank

    def mask(self, slots: list[int]) -> npt.NDArray[Any]:
        """``[rows, 1, width]``: ones over each row's adapter slot (``-1``: none)."""
        mask = np.zeros((len(slots), 1, self.slots * self.rank), dtype=self.dtype)
        for row, slot in enumerate(slots):
            if slot >= 0:
                mask[row, 0, slot * self.rank : (slot + 1) * self.rank] = 1
        return mask
