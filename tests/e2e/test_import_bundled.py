"""``kiln models import-bundled`` builds into the store, registers, and is idempotent."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def _kiln(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KILN_DATA_DIR": str(data_dir)}
    env.pop("KILN_DATABASE_URL", None)
    return subprocess.run(
        [sys.executable, "-m", "kiln_console", *args],
        env=env, capture_output=True, text=True, timeout=600, check=True,
    )  # fmt: skip


def test_import_bundled_is_idempotent(fresh_data_dir: Path) -> None:
    tmp_path = fresh_data_dir
    first = _kiln(tmp_path, "models", "import-bundled", "--only", "all-minilm-l6-v2")
    assert first.stdout.strip().splitlines()[-1] == "imported: all-minilm-l6-v2"
    listed = _kiln(tmp_path, "models", "list").stdout
    assert listed.startswith("all-minilm-l6-v2\t0.1.0\tembeddings\tsha256:")
    trees = list((tmp_path / "store" / "trees").iterdir())
    assert len(trees) == 1
    assert {p.name for p in trees[0].iterdir()} >= {"model.onnx", "tokenizer.json", "kiln.json"}
    second = _kiln(tmp_path, "models", "import-bundled", "--only", "all-minilm-l6-v2")
    assert second.stdout.strip().splitlines()[-1] == "imported: nothing (all up to date)"
    assert _kiln(tmp_path, "models", "list").stdout == listed
