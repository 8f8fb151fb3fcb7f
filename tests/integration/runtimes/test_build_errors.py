"""Bad input to ``python -m kiln_runtimes.build``: exit 2, one JSON error line naming the file
and field, and nothing left in or beside the output folder."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory, tiny_models: Any) -> Path:
    return Path(tiny_models.causal(tmp_path_factory.mktemp("src") / "llama", "llama"))


def _copy(source: Path, to: Path) -> Path:
    shutil.copytree(source, to)
    return to


def _refused(build_cli: Any, source: Path, tmp_path: Path, *args: str) -> dict[str, Any]:
    """Run a build that must fail; check exit status, error line and an empty parent."""
    parent = tmp_path / "out"
    parent.mkdir()
    run = build_cli.build(source, parent / "model", *args)
    assert run.returncode == 2, run.stderr[-3000:]
    assert set(run.last) == {"error", "file", "field"}
    assert list(parent.iterdir()) == []  # no OUT_DIR, no staging folder beside it
    print(run.last)
    return dict(run.last)


def test_unsupported_architecture(llama: Path, tmp_path: Path, build_cli: Any) -> None:
    source = _copy(llama, tmp_path / "bloom")
    config = json.loads((source / "config.json").read_text())
    config["architectures"] = ["BloomForCausalLM"]
    (source / "config.json").write_text(json.dumps(config))
    error = _refused(build_cli, source, tmp_path)
    assert (error["file"], error["field"]) == ("config.json", "architectures")
    assert "BloomForCausalLM" in error["error"]
    assert "LlamaForCausalLM" in error["error"]  # the list of what is supported


def test_unknown_task(llama: Path, tmp_path: Path, build_cli: Any) -> None:
    source = _copy(llama, tmp_path / "vision")
    config = json.loads((source / "config.json").read_text())
    config["architectures"] = ["ViTForImageClassification"]
    (source / "config.json").write_text(json.dumps(config))
    error = _refused(build_cli, source, tmp_path)
    assert (error["file"], error["field"]) == ("config.json", "architectures")


def test_missing_tokenizer(llama: Path, tmp_path: Path, build_cli: Any) -> None:
    source = _copy(llama, tmp_path / "no-tokenizer")
    (source / "tokenizer.json").unlink()
    error = _refused(build_cli, source, tmp_path)
    assert (error["file"], error["field"]) == ("tokenizer.json", None)


def test_missing_config(llama: Path, tmp_path: Path, build_cli: Any) -> None:
    source = _copy(llama, tmp_path / "no-config")
    (source / "config.json").unlink()
    error = _refused(build_cli, source, tmp_path)
    assert error["file"] == "config.json"


def test_missing_chat_template(llama: Path, tmp_path: Path, build_cli: Any) -> None:
    source = _copy(llama, tmp_path / "no-template")
    (source / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((source / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (source / "tokenizer_config.json").write_text(json.dumps(config))
    error = _refused(build_cli, source, tmp_path)
    assert (error["file"], error["field"]) == ("tokenizer_config.json", "chat_template")


@pytest.mark.parametrize("damage", ["truncate", "header"])
def test_corrupt_safetensors(llama: Path, tmp_path: Path, build_cli: Any, damage: str) -> None:
    source = _copy(llama, tmp_path / "corrupt")
    weights = source / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2] if damage == "truncate" else data[:8] + b"{oops")
    error = _refused(build_cli, source, tmp_path)
    assert error["file"] == "model.safetensors"
    assert "corrupt" in error["error"]
    if damage == "header":
        assert error["field"] == "header"
    else:  # the first tensor whose bytes are missing
        assert error["field"].startswith("model.layers.")
        assert "outside the" in error["error"]


def test_gguf_of_unsupported_type(tmp_path: Path, tiny_models: Any, build_cli: Any) -> None:
    source = tiny_models.gguf_file(tmp_path / "weird.gguf", "Q8_1")
    error = _refused(build_cli, source, tmp_path)
    assert (error["file"], error["field"]) == ("weird.gguf", "token_embd.weight")
    assert "Q8_1" in error["error"]


def test_gguf_of_unsupported_architecture(tmp_path: Path, tiny_models: Any, build_cli: Any) -> None:
    source = tiny_models.gguf_file(tmp_path / "odd.gguf", "Q8_0", architecture="rwkv9")
    error = _refused(build_cli, source, tmp_path)
    assert (error["file"], error["field"]) == ("odd.gguf", "general.architecture")


def test_too_large_for_memory_limit(llama: Path, tmp_path: Path, build_cli: Any) -> None:
    error = _refused(
        build_cli, llama, tmp_path, "--precision", "fp32", "--max-memory-bytes", "100000"
    )
    assert (error["file"], error["field"]) == (str(llama), "max_memory_bytes")
    assert "x 4 bytes (fp32)" in error["error"]


def test_embeddings_precision(tmp_path: Path, tiny_models: Any, build_cli: Any) -> None:
    source = tiny_models.sentence(tmp_path / "st", "mean", normalize=True)
    error = _refused(build_cli, source, tmp_path, "--precision", "int4")
    assert error["field"] == "precision"


def test_fp16_on_cpu(llama: Path, tmp_path: Path, build_cli: Any) -> None:
    error = _refused(build_cli, llama, tmp_path, "--precision", "fp16", "--target", "cpu")
    assert (error["file"], error["field"]) == (None, "precision")


def test_tensor_model_is_detected_not_built(
    tmp_path: Path, tensor_models: dict[str, Path], build_cli: Any
) -> None:
    onnx_file = tensor_models["mlp"]
    detected = build_cli.build(onnx_file, None, "--detect")
    assert detected.returncode == 0
    assert detected.last["kind"] == "tensor"
    assert detected.last["task"] == "tensor"
    error = _refused(build_cli, onnx_file, tmp_path)
    assert error["field"] == "task"


def test_failed_rebuild_keeps_the_previous_folder(
    llama: Path, tmp_path: Path, build_cli: Any
) -> None:
    out = tmp_path / "out" / "model"
    out.mkdir(parents=True)
    (out / "kiln.json").write_text("{}")
    source = _copy(llama, tmp_path / "broken")
    (source / "tokenizer.json").unlink()
    run = build_cli.build(source, out)
    assert run.returncode == 2
    assert sorted(p.name for p in out.parent.iterdir()) == ["model"]
    assert [p.name for p in out.iterdir()] == ["kiln.json"]


def test_settings_a_mend_does_not_build_are_refused_by_name(
    tmp_path: Path, tiny_models: Any, build_cli: Any
) -> None:
    """A setting the builder's mends refuse (found in the builder's own process) is exit 2 and
    an error line naming ``config.json`` and the field, as the checks before the builder are;
    nothing is left in or beside the output folder."""
    refused: dict[str, tuple[str, dict[str, Any], str]] = {
        "falcon": ("falcon", {"alibi": True}, "alibi"),
        "glm4_moe": ("glm4_moe", {"n_routed_experts": 4, "num_experts_per_tok": 2,
                                  "moe_intermediate_size": 32, "n_group": 2, "topk_group": 1},
                     "n_group"),
        "gpt2": ("gpt2", {"scale_attn_by_inverse_layer_idx": True},
                 "scale_attn_by_inverse_layer_idx"),
        "granite4_h": ("granitemoehybrid", {"layer_types": ["mamba", "attention"]},
                       "layer_types"),
        "granite4_moe": ("granitemoehybrid", {"num_local_experts": 4, "num_experts_per_tok": 2},
                         "num_local_experts"),
    }  # fmt: skip
    sources = {name: tiny_models.causal(tmp_path / "src" / name, kind, **settings)
               for name, (kind, settings, _) in refused.items()}  # fmt: skip
    runs = build_cli.build_many([(sources[n], tmp_path / n / "model", []) for n in refused])
    for name, run in zip(refused, runs, strict=True):
        assert run.returncode == 2, (name, run.lines[-1:])
        assert (run.last["file"], run.last["field"]) == ("config.json", refused[name][2])
        assert "not built" in run.last["error"]
        assert list((tmp_path / name).iterdir()) == []
