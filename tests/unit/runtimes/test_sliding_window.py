"""A sliding window the GenAI builder wrote for every layer but left out of the graph is set on
each attention node (and dropped from ``genai_config.json``); other windows are left alone."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import onnx
import pytest
from onnx import TensorProto, helper

from kiln_runtimes.build._genai import slide_every_layer
from kiln_runtimes.build._options import BuildError


def _folder(tmp_path: Path, window: dict[str, Any] | None, sizes: tuple[int, ...]) -> Path:
    nodes = [
        helper.make_node(
            "GroupQueryAttention", ["x"], [f"y{i}"], domain="com.microsoft", local_window_size=size
        )
        for i, size in enumerate(sizes)
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [1]) for i in range(len(sizes))],
    )  # fmt: skip
    onnx.save(helper.make_model(graph), str(tmp_path / "model.onnx"))
    decoder: dict[str, Any] = {"filename": "model.onnx"}
    if window is not None:
        decoder["sliding_window"] = window
    config = {"model": {"context_length": 256, "decoder": decoder}}
    (tmp_path / "genai_config.json").write_text(json.dumps(config))
    return tmp_path


def _sizes(folder: Path) -> list[int]:
    graph = onnx.load(str(folder / "model.onnx"))
    return [a.i for n in graph.graph.node for a in n.attribute if a.name == "local_window_size"]


def test_a_window_for_every_layer_goes_into_the_graph(tmp_path: Path) -> None:
    folder = _folder(tmp_path, {"window_size": 24, "layers": []}, (-1, -1))
    assert slide_every_layer(folder) == 24
    assert _sizes(folder) == [24, 24]
    decoder = json.loads((folder / "genai_config.json").read_text())["model"]["decoder"]
    assert "sliding_window" not in decoder


@pytest.mark.parametrize(
    ("window", "sizes"),
    [
        (None, (-1, -1)),
        ({"window_size": 48, "layers": [0]}, (48, -1)),  # Gemma 2's: in the graph already
        ({"window_size": 256, "layers": []}, (-1, -1)),  # no shorter than the context
    ],
)
def test_other_windows_are_left_alone(
    tmp_path: Path, window: dict[str, Any] | None, sizes: tuple[int, ...]
) -> None:
    folder = _folder(tmp_path, window, sizes)
    assert slide_every_layer(folder) == 0
    assert _sizes(folder) == list(sizes)


def test_a_graph_windowed_otherwise_is_refused(tmp_path: Path) -> None:
    folder = _folder(tmp_path, {"window_size": 24, "layers": []}, (-1, 32))
    with pytest.raises(BuildError) as refused:
        slide_every_layer(folder)
    assert refused.value.field == "sliding_window"
