"""An uploaded ONNX graph's inputs and outputs: what is not a served tensor is a 400 that says
what it is (by name) and what to do."""

from __future__ import annotations

from typing import TYPE_CHECKING

import onnx
import pytest
from onnx import TensorProto, helper

from kiln_platform.errors import BadRequest
from kiln_platform.registry.validation import inspect

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.unit


def _save(folder: Path, graph: onnx.GraphProto, *domains: tuple[str, int]) -> None:
    opsets = [helper.make_opsetid("", 17), *(helper.make_opsetid(d, v) for d, v in domains)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    onnx.save(model, str(folder / "model.onnx"))


def test_strings_are_bytes_and_an_unserved_type_is_named(tmp_path: Path) -> None:
    node = helper.make_node("Identity", ["text"], ["same"])
    graph = helper.make_graph(
        [node], "strings", [helper.make_tensor_value_info("text", TensorProto.STRING, ["n"])],
        [helper.make_tensor_value_info("same", TensorProto.STRING, ["n"])],
    )  # fmt: skip
    _save(tmp_path, graph)
    checked = inspect(tmp_path, 7, 21)
    assert [(s.name, s.datatype) for s in checked.inputs + checked.outputs] == [
        ("text", "BYTES"), ("same", "BYTES"),
    ]  # fmt: skip
    node = helper.make_node("Cast", ["x"], ["half"], to=TensorProto.BFLOAT16)
    graph = helper.make_graph(
        [node], "bf16", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("half", TensorProto.BFLOAT16, ["n"])],
    )  # fmt: skip
    _save(tmp_path, graph)
    with pytest.raises(BadRequest) as refused:
        inspect(tmp_path, 7, 21)
    assert "'half' has element type BFLOAT16" in str(refused.value)
    assert "BYTES" in str(refused.value)


def test_a_zipmap_output_says_how_to_convert_the_classifier(tmp_path: Path) -> None:
    """skl2onnx's classifiers return probabilities as a sequence of maps by default."""
    probs = helper.make_sequence_type_proto(
        helper.make_map_type_proto(TensorProto.INT64, helper.make_tensor_type_proto(1, []))
    )
    node = helper.make_node("ZipMap", ["x"], ["probs"], domain="ai.onnx.ml",
                            classlabels_int64s=[0, 1])  # fmt: skip
    graph = helper.make_graph(
        [node], "zipmap", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 2])],
        [helper.make_value_info("probs", probs)],
    )  # fmt: skip
    _save(tmp_path, graph, ("ai.onnx.ml", 1))
    with pytest.raises(BadRequest) as refused:
        inspect(tmp_path, 7, 21)
    assert "'probs' is a sequence, not a tensor" in str(refused.value)
    assert "'zipmap': False" in str(refused.value)
