"""OpenAI's ``dimensions`` on an embeddings request: a Matryoshka model's vectors cut to their
first ``dimensions`` numbers (and normalized again if the model normalizes), as OpenAI's
``text-embedding-3`` and vLLM answer it; a model not trained to be cut answers only its whole
width (``ModelManifest.matryoshka_dimensions``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from kiln_platform.errors import BadRequest

if TYPE_CHECKING:
    from kiln_runtimes.protocol import ModelManifest


def width(manifest: ModelManifest, dimensions: int | None, model: str) -> int | None:
    """The width to cut the vectors to (``None``: leave them whole), or a 400 naming
    ``dimensions``."""
    whole = manifest.dimensions
    if dimensions is None or dimensions == whole:
        return None
    cuts = manifest.matryoshka_dimensions
    if cuts is None:
        raise BadRequest(
            f"'dimensions' must be {whole} for `{model}`: it was not trained to be cut "
            "(its config.json names no matryoshka_dimensions).", param="dimensions",
        )  # fmt: skip
    if cuts and dimensions not in cuts:
        listed = ", ".join(map(str, cuts))
        raise BadRequest(f"'dimensions' must be one of {listed} for `{model}`.",
                         param="dimensions")  # fmt: skip
    if not 1 <= dimensions <= (whole or 0):
        raise BadRequest(f"'dimensions' must be from 1 to {whole} for `{model}`.",
                         param="dimensions")  # fmt: skip
    return dimensions


def cut(vectors: np.ndarray, dimensions: int, *, normalize: bool) -> np.ndarray:
    """Each vector's first ``dimensions`` numbers, L2-normalized again if ``normalize``."""
    kept = np.ascontiguousarray(vectors[:, :dimensions])
    return (unit(kept) if normalize else kept).astype(np.float32, copy=False)


def unit(vectors: np.ndarray) -> np.ndarray:
    """Each row over its L2 norm (a zero row stays zero)."""
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    rows: np.ndarray = vectors / np.maximum(norms, np.finfo(np.float32).tiny)
    return rows
