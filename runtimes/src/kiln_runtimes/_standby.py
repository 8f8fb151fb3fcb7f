"""Warm standby: a worker process started before it is given a model (the warm pool).

``python -m kiln_runtimes --standby`` imports the worker, the engine libraries and every backend,
opens one throwaway ONNX Runtime session (its process-wide environment), then blocks reading one
line from stdin: the JSON list of worker arguments to run with. A start handed to a standby
skips the interpreter start and those imports (about 0.4 s here), so what is left is the engine
load itself: from the cache, or compiled now. End of input (the supervisor went away) exits 0.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import sys

from kiln_runtimes.backends import BACKENDS


def preload() -> None:
    """Import what a worker will need and initialise ONNX Runtime's environment."""
    modules = dict.fromkeys(name.partition(":")[0] for name in BACKENDS.values())
    for name in [*modules, "kiln_runtimes._compile_cpu"]:
        with contextlib.suppress(ImportError):  # an optional engine library is missing
            importlib.import_module(name)
    import onnxruntime as ort
    from onnx import TensorProto, helper

    x, y = (helper.make_tensor_value_info(n, TensorProto.FLOAT, [1]) for n in "xy")
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "standby", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def assignment() -> list[str]:
    """Wait for the worker arguments (one JSON line on stdin); exit 0 at end of input."""
    line = sys.stdin.readline()
    if not line.strip():
        raise SystemExit(0)
    argv = json.loads(line)
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        raise SystemExit("standby: expected a JSON list of strings on stdin")
    return argv
