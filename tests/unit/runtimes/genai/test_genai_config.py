"""Reading the engine's view of a GenAI folder from ``genai_config.json``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kiln_runtimes.backends._genai_config import load_spec, spec_from_config
from kiln_runtimes.protocol import ModelManifest


def genai_config(**model: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "model": {
            "context_length": 8192,
            "eos_token_id": 2,
            "pad_token_id": 2,
            "vocab_size": 49152,
            "decoder": {
                "filename": "model.onnx",
                "head_size": 64,
                "num_hidden_layers": 30,
                "num_key_value_heads": 3,
                "inputs": {"past_key_names": "past_key_values.%d.key"},
                "outputs": {"present_value_names": "present.%d.value"},
            },
        }
    }
    base["model"].update(model)
    return base


def test_spec_from_a_builder_config() -> None:
    spec = spec_from_config(genai_config(), Path("m/model.onnx"), context_length=2048)
    assert (spec.num_layers, spec.num_kv_heads, spec.head_size) == (30, 3, 64)
    assert spec.context_length == 2048  # the manifest may narrow the model's context
    assert spec.eos_token_ids == frozenset({2})
    assert spec.kv_names()[:2] == [
        ("past_key_values.0.key", "present.0.key"),
        ("past_key_values.0.value", "present.0.value"),
    ]
    assert len(spec.kv_names()) == 60


def test_eos_lists_and_the_model_context_cap() -> None:
    spec = spec_from_config(genai_config(eos_token_id=[2, 0]), Path("m.onnx"), 100_000)
    assert spec.eos_token_ids == frozenset({0, 2})
    assert spec.context_length == 8192


def test_paged_exports_are_refused() -> None:
    config = genai_config()
    config["engine"] = {"dynamic_batching": {"block_size": 256}}
    with pytest.raises(ValueError, match="paged"):
        spec_from_config(config, Path("m.onnx"), 512)


def test_a_decoder_with_inputs_the_runner_does_not_feed_is_refused_naming_them() -> None:
    config = genai_config()
    config["model"]["decoder"]["inputs"] = {  # Qwen 3.5's: recurrent states beside the KV cache
        "input_ids": "input_ids", "attention_mask": "attention_mask",
        "past_key_names": "past_key_values.%d.key", "past_value_names": "past_key_values.%d.value",
        "past_conv_names": "past.%d.conv", "past_recurrent_names": "past.%d.recurrent",
    }  # fmt: skip
    config["model"]["decoder"]["outputs"] = {
        "logits": "logits", "present_conv_names": "present.%d.conv",
        "present_recurrent_names": "present.%d.recurrent",
    }  # fmt: skip
    spec = spec_from_config(config, Path("m.onnx"), 512)
    assert spec.state_names()[:3] == [
        ("past.0.conv", "present.0.conv"), ("past.0.recurrent", "present.0.recurrent"),
        ("past.1.conv", "present.1.conv"),
    ]  # fmt: skip
    config["model"]["decoder"]["inputs"]["position_ids"] = "position_ids"  # Qwen3-VL's unmended
    config["model"]["decoder"]["inputs"]["past_ssm_names"] = "past.%d.ssm"
    with pytest.raises(ValueError, match=r"does not feed \(past_ssm_names, position_ids\)"):
        spec_from_config(config, Path("m.onnx"), 512)


def test_a_sliding_window_needs_a_context_of_one_window() -> None:
    config = genai_config()
    config["model"]["decoder"]["sliding_window"] = {"window_size": 4096, "layers": [0, 2]}
    assert spec_from_config(config, Path("m.onnx"), 8192).context_length == 8192  # Gemma 2's
    with pytest.raises(ValueError, match="sliding window of 4096"):
        spec_from_config(config, Path("m.onnx"), 2048)


def test_model_file_must_stay_inside_the_folder(tmp_path: Path) -> None:
    (tmp_path / "genai_config.json").write_text(json.dumps(genai_config()))
    manifest = ModelManifest(
        name="m", task="generate", engine="onnxruntime-genai", model_file="../evil.onnx"
    )
    with pytest.raises(ValueError, match="outside"):
        load_spec(tmp_path, manifest)
