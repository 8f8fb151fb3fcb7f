"""A transformer encoder for ``bench/tensor.py``, built with ``onnx.helper`` (random weights).

``tokens`` INT64 [batch, 32] -> token + position embeddings (d 128) -> four pre-norm encoder
layers (4 heads, feed-forward 512, GELU) -> final layer norm -> mean over tokens ->
``embedding`` FP32 [batch, 128]. About 56 MFLOPs per item (multiply-adds counted as two), for
256 bytes of input: the shape of a ranking or embedding model, where an item is a short text.

    python bench/models/make_encoder.py OUT.onnx
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _graph

SEQ, DIM, HEADS, FFN, LAYERS, VOCAB = 32, 128, 4, 512, 4, 8192


def flops() -> int:
    """Floating-point operations per item (matrix products; norms and softmax left out)."""
    per_token = 2 * (4 * DIM * DIM + 2 * DIM * FFN) + 2 * 2 * SEQ * DIM
    return LAYERS * SEQ * per_token


class _Graph:
    def __init__(self, rng: np.random.Generator) -> None:
        self.rng, self.nodes, self.weights, self.count = rng, [], [], 0

    def name(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def const(self, array: np.ndarray, prefix: str = "w") -> str:
        name = self.name(prefix)
        self.weights.append(numpy_helper.from_array(array, name))
        return name

    def dense(self, rows: int, cols: int) -> str:
        w = self.rng.standard_normal((rows, cols)) * np.sqrt(1 / rows)
        return self.const(w.astype(np.float32))

    def op(self, op_type: str, inputs: list[str], **attrs: object) -> str:
        out = self.name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], **attrs))
        return out

    def norm(self, x: str) -> str:
        scale = self.const(np.ones(DIM, np.float32))
        bias = self.const(np.zeros(DIM, np.float32))
        return self.op("LayerNormalization", [x, scale, bias], axis=-1)

    def linear(self, x: str, rows: int, cols: int) -> str:
        return self.op("Add", [self.op("MatMul", [x, self.dense(rows, cols)]),
                               self.const(np.zeros(cols, np.float32))])  # fmt: skip

    def gelu(self, x: str) -> str:
        """0.5·x·(1 + erf(x/√2)), the pattern ONNX Runtime fuses into one Gelu."""
        scaled = self.op("Div", [x, self.const(np.array(np.sqrt(2), np.float32))])
        one = self.op("Add", [self.op("Erf", [scaled]), self.const(np.array(1, np.float32))])
        return self.op("Mul", [self.op("Mul", [x, one]), self.const(np.array(0.5, np.float32))])

    def attention(self, x: str) -> str:
        heads = self.const(np.array([0, SEQ, HEADS, DIM // HEADS], np.int64), "shape")
        split = [
            self.op("Transpose", [self.op("Reshape", [self.linear(x, DIM, DIM), heads])],
                    perm=[0, 2, 1, 3])
            for _ in range(3)
        ]  # fmt: skip
        q, k, v = split
        kt = self.op("Transpose", [k], perm=[0, 1, 3, 2])
        scale = self.const(np.array(1 / np.sqrt(DIM // HEADS), np.float32))
        scores = self.op("Mul", [self.op("MatMul", [q, kt]), scale])
        mixed = self.op("MatMul", [self.op("Softmax", [scores], axis=-1), v])
        merged = self.op(
            "Reshape",
            [self.op("Transpose", [mixed], perm=[0, 2, 1, 3]),
             self.const(np.array([0, SEQ, DIM], np.int64), "shape")],
        )  # fmt: skip
        return self.linear(merged, DIM, DIM)

    def layer(self, x: str) -> str:
        x = self.op("Add", [x, self.attention(self.norm(x))])
        hidden = self.gelu(self.linear(self.norm(x), DIM, FFN))
        return self.op("Add", [x, self.linear(hidden, FFN, DIM)])


def build(seed: int = 0) -> onnx.ModelProto:
    """The encoder with scaled random weights."""
    g = _Graph(np.random.default_rng(seed))
    table = g.const((g.rng.standard_normal((VOCAB, DIM)) * 0.02).astype(np.float32))
    positions = g.const((g.rng.standard_normal((SEQ, DIM)) * 0.02).astype(np.float32))
    x = g.op("Add", [g.op("Gather", [table, "tokens"], axis=0), positions])
    for _ in range(LAYERS):
        x = g.layer(x)
    pooled = g.op("ReduceMean", [g.norm(x)], axes=[1], keepdims=0)
    g.nodes.append(helper.make_node("Identity", [pooled], ["embedding"]))
    graph = helper.make_graph(
        g.nodes,
        "bench-encoder",
        [helper.make_tensor_value_info("tokens", TensorProto.INT64, ["batch", SEQ])],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["batch", DIM])],
        g.weights,
    )
    return _graph.model(graph)


def write(path: Path) -> Path:
    """Build and save the model (idempotent for a given path)."""
    return _graph.write(build, path)


if __name__ == "__main__":
    out = write(Path(sys.argv[1]))
    print(f"{out}: {flops() / 1e6:.1f} MFLOPs per item")
