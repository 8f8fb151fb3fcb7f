"""A compute-heavy CNN for ``bench/tensor.py``, built with ``onnx.helper`` (random weights).

``image`` FP32 [batch, 3, 64, 64] -> four 3x3 conv + ReLU stages (32, 64, 128, 128 channels,
strides 2, 1, 2, 1 minus the last) -> global average pool -> ``logits`` FP32 [batch, 10].
About 77 MFLOPs per image (multiply-adds counted as two).

    python bench/models/make_cnn.py OUT.onnx
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _graph

SIZE = 64
# (out channels, stride) of each 3x3 convolution
STAGES = ((32, 2), (64, 1), (128, 2))
CLASSES = 10


def flops(size: int = SIZE) -> int:
    """Floating-point operations per image."""
    total, channels = 0, 3
    for out, stride in STAGES:
        size //= stride
        total += 2 * size * size * out * channels * 9
        channels = out
    return total + 2 * channels * CLASSES


def build(seed: int = 0) -> onnx.ModelProto:
    """The CNN with He-initialized random weights."""
    rng = np.random.default_rng(seed)
    nodes, weights, channels, prev = [], [], 3, "image"
    for i, (out, stride) in enumerate(STAGES):
        w = rng.standard_normal((out, channels, 3, 3)) * np.sqrt(2 / (channels * 9))
        weights += [
            numpy_helper.from_array(w.astype(np.float32), f"w{i}"),
            numpy_helper.from_array(np.zeros(out, np.float32), f"b{i}"),
        ]
        nodes += [
            helper.make_node(
                "Conv", [prev, f"w{i}", f"b{i}"], [f"c{i}"],
                kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[stride, stride],
            ),
            helper.make_node("Relu", [f"c{i}"], [f"r{i}"]),
        ]  # fmt: skip
        channels, prev = out, f"r{i}"
    fc = rng.standard_normal((channels, CLASSES)) * np.sqrt(1 / channels)
    weights += [
        numpy_helper.from_array(fc.astype(np.float32), "fc"),
        numpy_helper.from_array(np.zeros(CLASSES, np.float32), "fc_b"),
    ]
    nodes += [
        helper.make_node("GlobalAveragePool", [prev], ["pooled"]),
        helper.make_node("Flatten", ["pooled"], ["flat"], axis=1),
        helper.make_node("Gemm", ["flat", "fc", "fc_b"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes,
        "bench-cnn",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 3, SIZE, SIZE])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", CLASSES])],
        weights,
    )
    return _graph.model(graph)


def write(path: Path) -> Path:
    """Build and save the model (idempotent for a given path)."""
    return _graph.write(build, path)


if __name__ == "__main__":
    out = write(Path(sys.argv[1]))
    print(f"{out}: {flops() / 1e6:.1f} MFLOPs per image")
