"""Synthetic inputs from a manifest's input specs (warmup, accuracy reports, profiles)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from kiln_runtimes.protocol import DATATYPES
from kiln_runtimes.tensor_bytes import BYTES

if TYPE_CHECKING:
    from kiln_runtimes.protocol import TensorSpec

# A dynamic dimension other than the batch gets this size in synthetic inputs.
DEFAULT_DYNAMIC_DIM = 16


def concrete_shape(spec: TensorSpec, batch: int, dynamic: int = DEFAULT_DYNAMIC_DIM) -> list[int]:
    """``spec.shape`` with dim 0 (if dynamic) set to ``batch`` and other dynamic dims filled."""
    shape = list(spec.shape)
    for i, dim in enumerate(shape):
        if dim < 0:
            shape[i] = batch if i == 0 else dynamic
    return shape


def synthetic_inputs(specs: list[TensorSpec], batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Deterministic inputs: standard normal floats, zeros for integers and booleans, a word
    for strings."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for spec in specs:
        shape = concrete_shape(spec, batch)
        if spec.datatype == BYTES:
            out[spec.name] = np.full(shape, "kiln", dtype=object)
            continue
        dtype = np.dtype(DATATYPES[spec.datatype])
        if dtype.kind == "f":
            out[spec.name] = rng.standard_normal(shape).astype(dtype)
        else:
            out[spec.name] = np.zeros(shape, dtype=dtype)
    return out
