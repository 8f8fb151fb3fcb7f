"""What the bench models share: an ONNX model from a graph, and saving one."""

from __future__ import annotations

from typing import TYPE_CHECKING

import onnx
from onnx import helper

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path


def model(graph: onnx.GraphProto) -> onnx.ModelProto:
    """``graph`` as a checked opset-17 model (IR 8, loadable by every ONNX Runtime we pin)."""
    out = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    out.ir_version = 8
    onnx.checker.check_model(out)
    return out


def write(build: Callable[[], onnx.ModelProto], path: Path) -> Path:
    """Build and save a model (idempotent for a given path)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(build(), path)
    return path
