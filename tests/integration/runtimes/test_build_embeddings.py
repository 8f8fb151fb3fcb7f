"""Embeddings builds of tiny BERT sentence-transformers folders (each pooling mode).

Each fp32 build must match sentence-transformers (cosine >= 0.9999 on fixed inputs) and be
served by the worker's own embeddings backend; an int8 build reports its cosines.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest

from kiln_runtimes.backends import create_backend
from kiln_runtimes.backends.base import BatchBackend, EngineOptions
from kiln_runtimes.protocol import MANIFEST_NAME, ModelManifest

pytestmark = pytest.mark.slow
HEADS = {
    "mean": ("mean", True),
    "cls": ("cls", False),
    "lasttoken": ("lasttoken", True),
    "concatenated": ("max+mean_sqrt_len_tokens+weightedmean", False),
    "embeddinggemma": ("mean", True),
    "qwen3-embedding": ("lasttoken", True),
}
ENCODERS = {"embeddinggemma": "gemma3", "qwen3-embedding": "qwen3"}
"""Decoders as encoders: EmbeddingGemma's shape (bidirectional, a window of 8 its texts pass,
two ``Dense`` layers) and Qwen3-Embedding's (causal, last token); the rest are BERTs."""
PROMPTS = {"query": "query: ", "passage": "passage: "}
"""The concatenated folder's prompts; its texts get ``query: `` unless a request names one."""


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory, tiny_models: Any) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("st")
    extra: dict[str, dict[str, Any]] = {
        "concatenated": {"prompts": PROMPTS, "default_prompt_name": "query"},
        "cls": {"do_lower_case": True},  # a cased tokenizer the framework lowercases for
    }
    return {
        name: tiny_models.sentence(root / name, pooling, normalize=normalize,
                                   encoder=ENCODERS.get(name, "bert"), **extra.get(name, {}))
        for name, (pooling, normalize) in HEADS.items()
    }  # fmt: skip


@pytest.fixture(scope="module")
def fp32(
    sources: dict[str, Path], tmp_path_factory: pytest.TempPathFactory, build_cli: Any
) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("built")
    runs = build_cli.build_many([(source, out / name, []) for name, source in sources.items()])
    return dict(zip(sources, runs, strict=True))


@pytest.mark.parametrize("name", list(HEADS))
def test_fp32_matches_sentence_transformers(name: str, fp32: dict[str, Any]) -> None:
    run = fp32[name]
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.phases == ["validating", "converting", "optimizing", "checking accuracy", "ready"]
    accuracy, manifest = run.last["accuracy"], run.last["manifest"]
    print(name, accuracy["cosines"], f"{run.last['seconds']} s")
    assert accuracy["type"] == "embeddings"
    assert len(accuracy["cosines"]) == len(accuracy["inputs"]) == 4
    assert accuracy["min_cosine"] >= 0.9999
    pooling, normalize = HEADS[name]
    assert (manifest["pooling"], manifest["normalize"]) == (pooling, normalize)
    assert (manifest["task"], manifest["engine"], manifest["dimensions"]) == (
        "embeddings", "onnxruntime", 64 * len(pooling.split("+")),
    )  # fmt: skip
    architecture = {"gemma3": "Gemma3TextModel", "qwen3": "Qwen3Model"}
    assert (manifest["precision"], manifest["architecture"]) == (
        "fp32", architecture.get(ENCODERS.get(name, ""), "BertModel"),
    )  # fmt: skip
    prompted = name == "concatenated"  # the accuracy check compared it with its default prompt
    assert manifest["prompts"] == (PROMPTS if prompted else {})
    assert manifest["default_prompt_name"] == ("query" if prompted else None)
    folder = Path(run.last["out_dir"])
    assert json.loads((folder / "accuracy.json").read_text()) == accuracy


@pytest.mark.parametrize("name", ["mean", "cls", "embeddinggemma", "qwen3-embedding"])
def test_worker_backend_serves_the_build(name: str, fp32: dict[str, Any]) -> None:
    folder = Path(fp32[name].last["out_dir"])
    manifest = msgspec.json.decode((folder / MANIFEST_NAME).read_bytes(), type=ModelManifest)
    backend = create_backend(manifest, EngineOptions(threads=1))
    assert isinstance(backend, BatchBackend)
    backend.load(folder, manifest)
    try:
        out = backend.run([[2, 10, 11, 12, 3], [2, 20, 3]])
    finally:
        backend.unload()
    vectors = np.asarray(out)
    assert vectors.shape == (2, 64)
    if HEADS[name][1]:
        assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


def test_int8_reports_cosines(sources: dict[str, Path], tmp_path: Path, build_cli: Any) -> None:
    run = build_cli.build(sources["mean"], tmp_path / "int8", "--precision", "int8")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "quantizing" in run.phases
    accuracy = run.last["accuracy"]
    print("int8", accuracy["cosines"], f"{run.last['seconds']} s")
    assert 0.9 <= accuracy["min_cosine"] <= 1.0
    assert run.last["manifest"]["precision"] == "int8"


def test_a_multi_label_classifier_answers_each_labels_sigmoid(
    tmp_path: Path, tiny_models: Any, build_cli: Any
) -> None:
    """A classifier whose labels may all hold (``problem_type``) is built with a sigmoid per
    label, as transformers' pipeline answers it, not a softmax."""
    labels = ("toxic", "insult", "threat", "spam")
    source = tiny_models.cross_encoder(tmp_path / "src", seed=6, labels=labels, multi_label=True)
    run = build_cli.build(source, tmp_path / "out")
    assert run.returncode == 0, run.stderr[-3000:]
    accuracy, manifest = run.last["accuracy"], run.last["manifest"]
    print("multi-label", accuracy["max_abs_diff"], f"{run.last['seconds']} s")
    assert (manifest["labels"], manifest["dimensions"], manifest["scores"]) == (
        list(labels), 4, False,
    )  # fmt: skip
    assert accuracy["type"] == "classify"
    assert accuracy["max_abs_diff"] < 1e-5
    assert accuracy["top1_agreement"] == 1.0
    sums = np.asarray(accuracy["built"]).sum(axis=1)
    assert not np.allclose(sums, 1.0, atol=1e-3)  # independent sigmoids, not one softmax


def test_a_cross_encoder_answers_with_the_activation_its_config_names(
    tmp_path: Path, tiny_models: Any, build_cli: Any
) -> None:
    """``sentence_transformers.activation_fn: Identity`` (a reranker trained on raw scores):
    ``CrossEncoder.predict`` answers the logit, and so does the build, not its sigmoid."""
    identity = "torch.nn.modules.linear.Identity"
    source = tiny_models.cross_encoder(tmp_path / "src", seed=6, activation=identity)
    run = build_cli.build(source, tmp_path / "out")
    assert run.returncode == 0, run.stderr[-3000:]
    accuracy = run.last["accuracy"]
    print("identity", accuracy["max_abs_diff"], accuracy["built"])
    assert accuracy["type"] == "score"
    assert accuracy["max_abs_diff"] < 1e-5
    assert not all(0 < s < 1 for s in np.ravel(accuracy["built"]))  # raw logits, not sigmoids


@pytest.mark.parametrize("pad", [3, None])
def test_a_decoders_classifier_reads_each_rows_last_real_token(
    pad: int | None, tmp_path: Path, tiny_models: Any, build_cli: Any
) -> None:
    """A decoder's classifier scores the last token that is not ``pad_token_id``: the graph
    writes that token where a row is padding (the tokenizer's, when the config names none),
    so texts of different lengths in one batch answer as transformers does each alone."""
    source = tiny_models.decoder_classifier(tmp_path / "src", 2, seed=1, pad_token_id=pad)
    run = build_cli.build(source, tmp_path / "out")
    assert run.returncode == 0, run.stderr[-3000:]
    accuracy = run.last["accuracy"]
    print("decoder classifier", pad, accuracy["max_abs_diff"], accuracy["top1_agreement"])
    assert len({len(text.split()) for text in accuracy["inputs"]}) > 1  # padded rows
    assert accuracy["max_abs_diff"] < 1e-5
    assert accuracy["top1_agreement"] == 1.0


def test_a_dense_layer_after_the_pooling_is_built_in(
    tmp_path: Path, tiny_models: Any, build_cli: Any
) -> None:
    """LaBSE's and distiluse's heads: pooling, a ``Dense`` layer (tanh) to fewer dimensions,
    then normalization; the graph has all three."""
    source = tiny_models.sentence(tmp_path / "src", "mean", normalize=True, dense=32)
    run = build_cli.build(source, tmp_path / "out")
    assert run.returncode == 0, run.stderr[-3000:]
    accuracy, manifest = run.last["accuracy"], run.last["manifest"]
    print("dense", accuracy["min_cosine"])
    assert manifest["dimensions"] == 32
    assert accuracy["min_cosine"] >= 0.9999


def test_a_module_that_cannot_be_built_is_named(
    tmp_path: Path, tiny_models: Any, build_cli: Any
) -> None:
    source = tiny_models.sentence(tmp_path / "src", "mean", normalize=False)
    modules = json.loads((source / "modules.json").read_text())
    modules.append({"idx": 2, "name": "2", "path": "2_LayerNorm",
                    "type": "sentence_transformers.models.LayerNorm"})  # fmt: skip
    (source / "modules.json").write_text(json.dumps(modules))
    run = build_cli.build(source, tmp_path / "out")
    assert run.returncode == 2
    assert (run.last["file"], run.last["field"]) == ("modules.json", "type")
    assert "LayerNorm" in run.last["error"]
    assert not (tmp_path / "out").exists()
