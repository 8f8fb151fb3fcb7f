"""The import build's command line: generation builds get the bundled importer's graph."""

from __future__ import annotations

from pathlib import Path

import pytest

from kiln_platform.compiler.builds import command
from kiln_platform.db.tables import CompileJob
from kiln_platform.settings import Settings

pytestmark = pytest.mark.unit


def _job(task: str) -> CompileJob:
    return CompileJob(
        task=task, precision="int4", target="cpu", model_name="m", version_name="1",
        source_digest="sha256:" + "0" * 64,
    )  # fmt: skip


def test_generation_builds_prune_the_lm_head_like_the_bundled_importer(tmp_path: Path) -> None:
    cmd = command(_job("generate"), tmp_path / "src", tmp_path / "out", Settings(data_dir=tmp_path))
    assert "--prune-lm-head" in cmd
    assert cmd[cmd.index("--precision") + 1] == "int4"


def test_embedding_builds_have_no_lm_head_to_prune(tmp_path: Path) -> None:
    cmd = command(
        _job("embeddings"), tmp_path / "src", tmp_path / "out", Settings(data_dir=tmp_path)
    )
    assert "--prune-lm-head" not in cmd


def test_a_build_that_scores_prompts_keeps_every_positions_logits(tmp_path: Path) -> None:
    job = _job("generate")
    job.engine_settings = {"precision": "int4", "score_prompts": True}
    cmd = command(job, tmp_path / "src", tmp_path / "out", Settings(data_dir=tmp_path))
    assert "--prune-lm-head" not in cmd
