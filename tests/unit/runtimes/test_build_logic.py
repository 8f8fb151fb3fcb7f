"""The build library's pure parts: task detection, pooling, safetensors checks, report maths."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest

from kiln_runtimes.accuracy import ClassAccuracy, EmbedAccuracy, GenerateAccuracy, ScoreAccuracy
from kiln_runtimes.build import BuildError
from kiln_runtimes.build._accuracy import agreement, cosines, faithful, teacher_forced
from kiln_runtimes.build._checks import (
    builder_architectures,
    chat_template,
    chat_templates,
    check_architecture,
    safetensors_parameters,
    weight_parameters,
)
from kiln_runtimes.build._encoder import context
from kiln_runtimes.build._genai import (
    TOKENIZER_FILES,
    builder_command,
    copy_tokenizer,
    provider,
    sampling_defaults,
    stop_token_ids,
)
from kiln_runtimes.build._options import check_memory, memory_needed
from kiln_runtimes.build._pooling import pooling_mode, read_head
from kiln_runtimes.build._scorer import sigmoid
from kiln_runtimes.build._source import classes, detect, task_for
from kiln_runtimes.protocol import ModelManifest


@pytest.mark.parametrize(
    ("config", "modules", "task"),
    [
        ({"architectures": ["LlamaForCausalLM"]}, False, "generate"),
        ({"architectures": ["Qwen3ForCausalLM"]}, False, "generate"),
        ({"architectures": ["GPT2LMHeadModel"]}, False, "generate"),
        ({"architectures": ["Gemma3ForConditionalGeneration"]}, False, "generate"),  # its text
        ({"architectures": ["Qwen3_5ForConditionalGeneration"]}, False, "generate"),
        ({"architectures": ["WhisperForConditionalGeneration"]}, False, None),
        ({"architectures": ["BertModel"]}, False, "embeddings"),
        ({"architectures": ["XLMRobertaModel"]}, True, "embeddings"),
        ({"model_type": "bert"}, False, "embeddings"),
        (
            {"architectures": ["BertForSequenceClassification"], "id2label": {"0": "L"}},
            False,
            "embeddings",
        ),  # a cross-encoder: one label
        (
            {"architectures": ["XLMRobertaForSequenceClassification"], "num_labels": 1},
            False,
            "embeddings",
        ),
        ({"architectures": ["BertForSequenceClassification"]}, False, "embeddings"),  # two
        ({"architectures": ["ViTForImageClassification"]}, False, None),
        ({}, False, None),
    ],
)
def test_task_for(config: dict[str, object], modules: bool, task: str | None) -> None:
    assert task_for(config, has_modules=modules) == task


@pytest.mark.parametrize(
    ("config", "labels"),
    [
        ({"architectures": ["BertForSequenceClassification"], "id2label": {"0": "L"}}, 1),
        ({"architectures": ["BertForSequenceClassification"]}, 2),  # transformers' default
        ({"architectures": ["RobertaForSequenceClassification"], "num_labels": 5}, 5),
        ({"architectures": ["BertForSequenceClassification"], "id2label": dict.fromkeys("abc")}, 3),
        ({"architectures": ["BertModel"], "id2label": {"0": "L"}}, 0),
    ],
)
def test_classes(config: dict[str, object], labels: int) -> None:
    assert classes(config) == labels


def test_a_classifiers_columns_are_a_softmax_unless_labels_may_all_hold() -> None:
    assert sigmoid(1, None)  # a cross-encoder's one score
    assert not sigmoid(3, None)
    assert not sigmoid(3, "single_label_classification")
    assert sigmoid(3, "multi_label_classification")


def test_detect_kinds(tmp_path: Path) -> None:
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    (tmp_path / "t.onnx").write_bytes(b"")
    genai = tmp_path / "genai"
    genai.mkdir()
    (genai / "genai_config.json").write_text("{}")
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"architectures": ["BertModel"]}))
    assert detect(tmp_path / "m.gguf").kind == "gguf"
    assert detect(tmp_path / "t.onnx").task == "tensor"
    assert detect(genai).kind == "genai"
    assert detect(hf).task == "embeddings"
    assert detect(hf, "generate").task == "generate"  # an explicit task overrides
    with pytest.raises(BuildError) as refused:
        detect(tmp_path / "m.gguf", "embeddings")
    assert refused.value.field == "task"


def test_builder_architectures_cover_the_brief() -> None:
    wanted = {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
              "Phi3ForCausalLM", "GemmaForCausalLM", "Gemma2ForCausalLM",
              "Olmo2ForCausalLM", "Olmo3ForCausalLM", "StableLmForCausalLM",
              "Starcoder2ForCausalLM", "CohereForCausalLM", "Cohere2ForCausalLM",
              "MixtralForCausalLM", "Qwen3MoeForCausalLM", "Qwen2MoeForCausalLM",
              "GraniteMoeForCausalLM", "OlmoeForCausalLM", "GPT2LMHeadModel",
              "OPTForCausalLM", "GPTNeoXForCausalLM", "GlmForCausalLM",
              "Glm4ForCausalLM", "FalconForCausalLM", "Gemma3ForConditionalGeneration",
              "Mistral3ForConditionalGeneration", "HeliumForCausalLM", "SeedOssForCausalLM",
              "ArceeForCausalLM", "MinistralForCausalLM", "Ministral3ForCausalLM",
              "Exaone4ForCausalLM", "GPTBigCodeForCausalLM", "Qwen3VLForConditionalGeneration",
              "Qwen2_5_VLForConditionalGeneration", "Ernie4_5ForCausalLM",
              "HunYuanDenseV1ForCausalLM", "GraniteForCausalLM", "GptOssForCausalLM",
              "Ernie4_5_MoeForCausalLM", "Glm4MoeForCausalLM", "HunYuanMoEV1ForCausalLM",
              "MiniMaxM2ForCausalLM", "Dots1ForCausalLM", "Qwen3_5ForConditionalGeneration",
              "Qwen3_5MoeForConditionalGeneration", "Lfm2ForCausalLM", "Qwen3_5ForCausalLM",
              "Qwen3_5MoeForCausalLM", "GraniteMoeHybridForCausalLM",
              "ApertusForCausalLM"}  # fmt: skip  # from Olmo2: Kiln's own
    assert wanted <= builder_architectures()
    # the builder exports it too, but an encoder-decoder is not Kiln's runner's
    assert "WhisperForConditionalGeneration" not in builder_architectures()
    from kiln_runtimes.build._kilns import HOSTS

    assert set(HOSTS.values()) <= builder_architectures() - set(HOSTS)  # the builder's own
    with pytest.raises(BuildError) as refused:
        check_architecture("BloomForCausalLM")
    assert (refused.value.file, refused.value.field) == ("config.json", "architectures")


@pytest.mark.parametrize(
    ("config", "mode"),
    [
        ({"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": False}, "mean"),
        ({"pooling_mode_cls_token": True}, "cls"),
        ({"pooling_mode_lasttoken": True}, "lasttoken"),
        ({"pooling_mode_max_tokens": True}, "max"),
        ({"pooling_mode": "cls"}, "cls"),
        ({}, "mean"),  # no flag on: sentence-transformers pools by mean
        # flags concatenate in sentence-transformers' order, a list in its own
        ({"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": True}, "cls+mean"),
        ({"pooling_mode": ["weightedmean", "max"]}, "weightedmean+max"),
        ({"pooling_mode": "mean_sqrt_len_tokens", "pooling_mode_cls_token": True},
         "mean_sqrt_len_tokens"),
    ],
)  # fmt: skip
def test_pooling_mode(config: dict[str, object], mode: str) -> None:
    assert pooling_mode(config) == mode


@pytest.mark.parametrize(
    "config", [{"pooling_mode": "sum"}, {"pooling_mode": []}, {"pooling_mode": 3},
               {"pooling_mode": ["mean", None]}],
)  # fmt: skip
def test_pooling_mode_refuses(config: dict[str, object]) -> None:
    with pytest.raises(BuildError) as refused:
        pooling_mode(config)
    assert (refused.value.file, refused.value.field) == ("1_Pooling/config.json", "pooling_mode")


def test_read_head(tmp_path: Path) -> None:
    assert (read_head(tmp_path).pooling, read_head(tmp_path).normalize) == ("mean", False)
    kinds = [("", "Transformer"), ("1_Pooling", "Pooling"), ("2_Normalize", "Normalize")]
    modules = [{"path": p, "type": f"sentence_transformers.models.{k}"} for p, k in kinds]
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text('{"pooling_mode_cls_token": true}')
    head = read_head(tmp_path)
    assert (head.encoder_dir, head.pooling, head.normalize) == ("", "cls", True)
    assert head.dense == ()
    kinds[2:] = [("2_Dense", "Dense"), ("3_Dense", "Dense"), ("4_Normalize", "Normalize")]
    modules = [{"path": p, "type": f"sentence_transformers.models.{k}"} for p, k in kinds]
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    assert read_head(tmp_path).dense == ("2_Dense", "3_Dense")
    (tmp_path / "modules.json").write_text(json.dumps([modules[i] for i in (0, 1, 4, 2)]))
    with pytest.raises(BuildError, match="Normalize must be the last"):
        read_head(tmp_path)


@pytest.mark.parametrize(
    ("config", "pooling", "field"),
    [
        ({"prompts": {"query": "q: "}, "default_prompt_name": "passage"}, {},
         "default_prompt_name"),
        ({"prompts": {"query": 3}}, {}, "prompts"),
        ({"prompts": {"query": "q: "}, "default_prompt_name": "query"},
         {"include_prompt": False}, "include_prompt"),
    ],
)  # fmt: skip
def test_prompts_are_read_or_refused(
    tmp_path: Path, config: dict[str, object], pooling: dict[str, object], field: str
) -> None:
    kinds = [("", "Transformer"), ("1_Pooling", "Pooling")]
    modules = [{"path": p, "type": f"sentence_transformers.models.{k}"} for p, k in kinds]
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text("{}")
    st_config = tmp_path / "config_sentence_transformers.json"
    st_config.write_text(json.dumps({"prompts": {"query": "q: "}, "default_prompt_name": "query"}))
    head = read_head(tmp_path)
    assert (head.prompts, head.default_prompt_name) == ({"query": "q: "}, "query")
    st_config.write_text(json.dumps({"prompts": {"query": "q: "}, "default_prompt_name": None}))
    (tmp_path / "1_Pooling" / "config.json").write_text('{"include_prompt": false}')
    assert read_head(tmp_path).prompts == {}  # a pooling without prompts serves none
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    st_config.write_text(json.dumps(config))
    with pytest.raises(BuildError) as refused:
        read_head(tmp_path)
    assert refused.value.field == field


def _safetensors(path: Path, header: dict[str, object], data: bytes) -> Path:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


def test_pickled_weights_are_refused_by_name(tmp_path: Path) -> None:
    (tmp_path / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(BuildError, match="unpickling can run code") as refused:
        weight_parameters(tmp_path)
    assert refused.value.file == "pytorch_model.bin"
    (tmp_path / "pytorch_model.bin").unlink()
    (tmp_path / "training_args.bin").write_bytes(b"the trainer's, not weights")
    with pytest.raises(BuildError, match=r"no \*\.safetensors") as missing:
        weight_parameters(tmp_path)
    assert missing.value.file == "model.safetensors"


def test_safetensors_parameters(tmp_path: Path) -> None:
    header = {"__metadata__": {"format": "pt"},
              "a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
              "b": {"dtype": "F32", "shape": [4], "data_offsets": [24, 40]}}  # fmt: skip
    assert (
        safetensors_parameters(_safetensors(tmp_path / "ok.safetensors", header, bytes(40))) == 10
    )
    with pytest.raises(BuildError) as short:
        safetensors_parameters(_safetensors(tmp_path / "short.safetensors", header, bytes(30)))
    assert (short.value.file, short.value.field) == ("short.safetensors", "b")
    with pytest.raises(BuildError) as padded:
        safetensors_parameters(_safetensors(tmp_path / "long.safetensors", header, bytes(48)))
    assert padded.value.field == "data"
    (tmp_path / "huge.safetensors").write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    with pytest.raises(BuildError) as huge:
        safetensors_parameters(tmp_path / "huge.safetensors")
    assert huge.value.field == "header"


def test_memory_estimate() -> None:
    assert memory_needed(1_000_000, "int4") == 500_000
    assert memory_needed(1_000_000, "fp16") == 2_000_000
    check_memory(1_000_000, "int8", 1_000_000, "x")
    with pytest.raises(BuildError) as refused:
        check_memory(1_000_000, "fp32", 3_999_999, "model.gguf")
    assert (refused.value.file, refused.value.field) == ("model.gguf", "max_memory_bytes")


def test_stop_token_ids(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"eos_token_id": [128001, 128009]}')
    (tmp_path / "generation_config.json").write_text('{"eos_token_id": 128008}')
    assert stop_token_ids(tmp_path) == [128001, 128008, 128009]


def test_builder_command_and_provider(tmp_path: Path) -> None:
    command = builder_command(tmp_path, tmp_path / "o", tmp_path / "c", precision="int8",
                              target="cuda", prune_lm_head=True)  # fmt: skip
    assert command[command.index("-p") + 1 :][:3] == ["int8", "-e", "cuda"]
    assert command[-3:] == ["--extra_options", "exclude_mtp=true", "prune_lm_head=true"]
    options = {"provider_options": [{"cuda": {"enable_cuda_graph": "0"}}]}
    assert provider({"model": {"decoder": {"session_options": options}}}) == "cuda"
    assert provider({"model": {"decoder": {"session_options": {}}}}) == "cpu"


def test_agreement() -> None:
    assert agreement([1, 2, 3], [1, 2, 3]) == (3, None)
    assert agreement([1, 2, 3], [1, 5, 3]) == (1, 1)
    assert agreement([1, 2, 3], [1, 2]) == (2, 2)  # the built side stopped early


def test_teacher_forced_and_cosines() -> None:
    ref = np.array([[0.0, 1.0, 0.5], [2.0, 0.0, 0.0]], dtype=np.float32)
    built = np.array([[0.0, 0.9, 0.5], [0.0, 0.0, 2.5]], dtype=np.float32)
    rate, diff, margin = teacher_forced(ref, built)
    assert rate == 0.5
    assert diff == pytest.approx(2.5)
    assert margin == pytest.approx(0.5)
    assert cosines(ref, ref) == pytest.approx([1.0, 1.0])
    assert cosines(np.array([[1.0, 0.0]]), np.array([[0.0, 1.0]])) == [0.0]


def test_old_manifests_still_decode() -> None:
    old = b'{"name":"m","task":"generate","engine":"onnxruntime-genai","context_length":8192}'
    manifest = msgspec.json.decode(old, type=ModelManifest)
    assert (manifest.stop_token_ids, manifest.precision, manifest.pooling) == ([], None, None)


def _generated(diff: float) -> GenerateAccuracy:
    return GenerateAccuracy(
        prompt_ids=[1], tokens=2, reference_ids=[5, 6], built_ids=[5, 7], equal_prefix=1,
        first_divergence=1, top1_agreement=0.5, max_abs_logit_diff=diff, reference_min_margin=0.1,
    )  # fmt: skip


def test_an_fp32_build_unlike_its_source_fails() -> None:
    embed = EmbedAccuracy(inputs=["a"], cosines=[0.98], min_cosine=0.98)
    score = ScoreAccuracy(pairs=[["a", "b"]], reference=[0.9], built=[0.5], max_abs_diff=0.4)
    classes = ClassAccuracy(inputs=["a"], reference=[[0.5, 0.5]], built=[[0.5, 0.5]],
                            max_abs_diff=2e-7, top1_agreement=1.0)  # fmt: skip
    faithful(_generated(0.007), "fp32")  # a right conversion's figure (Nemotron's, tiny)
    for bad in (embed, score, _generated(1.07), _generated(float("nan"))):
        with pytest.raises(BuildError) as refused:
            faithful(bad, "fp32")
        assert refused.value.field == "architectures"
        assert "unlike its source" in str(refused.value)
        faithful(bad, "int8")  # quantization's loss is reported, not refused
    faithful(classes, "fp32")


def test_an_encoders_context_is_what_its_framework_reads(tmp_path: Path) -> None:
    assert context(tmp_path, 512) == 512
    (tmp_path / "tokenizer_config.json").write_text('{"model_max_length": 512}')
    assert context(tmp_path, 514) == 512  # RoBERTa: two positions are the padding's
    (tmp_path / "tokenizer_config.json").write_text('{"model_max_length": 1e30}')
    assert context(tmp_path, 514) == 514  # transformers' "no limit"
    (tmp_path / "sentence_bert_config.json").write_text('{"max_seq_length": 256}')
    assert context(tmp_path, 512) == 256  # all-MiniLM-L6-v2
    assert context(tmp_path, 128) == 128


def test_sampling_defaults_are_generation_configs_in_range(tmp_path: Path) -> None:
    assert sampling_defaults(tmp_path) == {}
    (tmp_path / "generation_config.json").write_text(json.dumps({
        "do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20,
        "repetition_penalty": 1.05, "min_p": True, "max_new_tokens": 512,
    }))  # fmt: skip
    assert sampling_defaults(tmp_path) == {
        "temperature": 0.7, "top_p": 0.8, "top_k": 20.0, "repetition_penalty": 1.05,
        "max_tokens": 512.0,
    }  # fmt: skip
    (tmp_path / "generation_config.json").write_text('{"temperature": 3, "top_p": -1}')
    assert sampling_defaults(tmp_path) == {}  # out of range: not a default


def test_a_list_of_named_chat_templates_gives_its_default(tmp_path: Path) -> None:
    named = [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": named}))
    assert chat_template(tmp_path) == "D"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": named[:1]}))
    assert chat_template(tmp_path) is None


def test_named_templates_are_read_from_a_list_or_their_own_files(tmp_path: Path) -> None:
    extra = tmp_path / "additional_chat_templates"  # transformers' layout since 4.54
    extra.mkdir()
    (extra / "tool_use.jinja").write_text("T")
    (tmp_path / "chat_template.jinja").write_text("D")
    assert chat_templates(tmp_path) == {"default": "D", "tool_use": "T"}
    (tmp_path / "chat_template.jinja").unlink()
    (extra / "tool_use.jinja").unlink()
    named = [{"name": "default", "template": "D"}, {"name": "rag", "template": "R"}, {"x": 1}]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": named}))
    assert chat_templates(tmp_path) == {"default": "D", "rag": "R"}


def test_a_ggufs_named_templates_are_read(tmp_path: Path) -> None:
    import gguf

    from kiln_runtimes.build._gguf import named_templates

    writer = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "llama")
    writer.add_chat_template("D")  # the default: transformers reads it
    writer.add_string("tokenizer.chat_template.tool_use", "T")
    writer.add_string("tokenizer.chat_template.../x", "bad name")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    assert named_templates(tmp_path / "m.gguf") == {"tool_use": "T"}


def test_the_built_folder_gets_the_default_template_inline_the_others_apart(
    tmp_path: Path,
) -> None:
    source, out = tmp_path / "src", tmp_path / "out"
    source.mkdir()
    out.mkdir()
    named = [{"name": "default", "template": "D"}, {"name": "tool_use", "template": "T"}]
    for name in TOKENIZER_FILES:
        (source / name).write_text("{}")
    (source / "tokenizer_config.json").write_text(json.dumps({"chat_template": named}))
    copy_tokenizer(source, out)
    assert json.loads((out / "tokenizer_config.json").read_text())["chat_template"] == "D"
    assert (out / "additional_chat_templates" / "tool_use.jinja").read_text() == "T"


@pytest.mark.parametrize("architecture", ["qwen3moe", "qwen2moe", "gpt-oss"])
def test_a_gguf_named_as_llama_cpp_names_it_is_taken(
    architecture: str, tmp_path: Path, tiny_models: Any
) -> None:
    """llama.cpp writes ``qwen3moe`` where transformers lists ``qwen3_moe`` (and reads it as
    that): such a file passes the check; an architecture neither knows does not."""
    from kiln_runtimes.build._gguf import inspect

    assert inspect(tiny_models.gguf_file(tmp_path / "m.gguf", "F32", architecture=architecture))
    with pytest.raises(BuildError) as refused:
        inspect(tiny_models.gguf_file(tmp_path / "x.gguf", "F32", architecture="qwen4moe"))
    assert refused.value.field == "general.architecture"
