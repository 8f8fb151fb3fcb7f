"""Build a served model folder from what a user brings: ``python -m kiln_runtimes.build``.

Sources: a Hugging Face folder (``config.json``, safetensors, tokenizer), a single ``.gguf``
file, a prebuilt ONNX Runtime GenAI folder, or an ONNX tensor model (detected, not built).
Generation models go through the onnxruntime-genai builder, embeddings models are exported with
their sentence-transformers pooling; every build is compared with its source framework and the
report saved as ``accuracy.json``. Torch and transformers are imported only by this package's
private modules, in the build process; the serving path never imports them.
"""

from __future__ import annotations

from kiln_runtimes.build._options import BuildError, BuildOptions
from kiln_runtimes.build._pipeline import build
from kiln_runtimes.build._source import Source, detect

__all__ = ["BuildError", "BuildOptions", "Source", "build", "detect"]
