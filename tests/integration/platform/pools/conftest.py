"""The pool tests' model: the ``mlp`` tensor model in a store, as a pool's ``--model-dir``."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from kiln_runtimes.protocol import MANIFEST_NAME, ModelManifest
from kiln_runtimes.store import ArtifactStore


@pytest.fixture
def model_dir(tensor_models: dict[str, Path], mlp_manifest: ModelManifest, tmp_path: Path) -> Path:
    """The ``mlp`` model's tree in a fresh local store."""
    folder = tmp_path / "mlp"
    folder.mkdir()
    (folder / "model.onnx").write_bytes(tensor_models["mlp"].read_bytes())
    (folder / MANIFEST_NAME).write_bytes(msgspec.json.encode(mlp_manifest))
    store = ArtifactStore(tmp_path / "store")
    return store.path(store.put_dir(folder))
