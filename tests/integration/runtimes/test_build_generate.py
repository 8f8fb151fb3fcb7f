"""Generation builds of tiny random Llama, Qwen2, Phi-3, Gemma, Mistral, Gemma 2, Gemma 3, OLMo
(1-3), SmolLM3, StableLM 2, Starcoder2, Command R+, Command R7B, Qwen3-MoE, GPT-2, OPT,
GPT-NeoX, Phi-2, GLM-4, Helium, Arcee AFM, EXAONE 4.0, GPTBigCode, ERNIE 4.5, HunYuan,
Granite, Granite 4.0 Micro, GPT-OSS, ERNIE 4.5 MoE, GLM-4.5, HunYuan MoE, MiniMax-M2, dots.llm1
and LFM2 folders,
and Gemma 3's, Ministral 3's, Qwen3-VL's and Qwen 3.5's (and its MoE's) vision-language ones
(their text decoders), through the builder (:mod:`kiln_runtimes.build._builder`'s mends).

fp32 builds must reproduce transformers' greedy output token for token (the models are drawn
with a wide init so their logits are far from ties); an int4 build reports how far it drifts;
a CUDA-target build is produced here on CPU and its structure checked. Mistral's and Gemma 2's
sliding windows (on every layer; on every other layer) are far shorter than the sequences
checked, so attending past them would show; Gemma 3's local and global layers each have their
own RoPE (the global one's scaled), so a layer given the other's would show too; Qwen2's RoPE
is YaRN's; OLMo's norms are weightless LayerNorms; one of SmolLM3's layers has no RoPE;
StableLM turns a quarter of each head; StableLM's and Starcoder2's norms are LayerNorms with
biases, at their configs' epsilon (Phi-2's too: the builder's 1e-6 made it 1.8e-3 off);
Command R7B's (Cohere 2's) layer runs attention and MLP in parallel, its RoPE turns
interleaved pairs on its windowed layer only, and its logits are scaled by 1/16; GLM-4's on
half of each head, and it norms each sublayer's output before the residual add.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import msgspec
import onnx
import pytest

from kiln_runtimes import backends

pytestmark = pytest.mark.slow
ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "gemma": "GemmaForCausalLM",
    "mistral": "MistralForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3": "Gemma3ForCausalLM",
    "gemma3_vl": "Gemma3ForConditionalGeneration",
    "mistral3": "Mistral3ForConditionalGeneration",
    "olmo": "OlmoForCausalLM",
    "olmo2": "Olmo2ForCausalLM",
    "olmo3": "Olmo3ForCausalLM",
    "smollm3": "SmolLM3ForCausalLM",
    "stablelm": "StableLmForCausalLM",
    "starcoder2": "Starcoder2ForCausalLM",
    "cohere": "CohereForCausalLM",
    "cohere2": "Cohere2ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "gpt2": "GPT2LMHeadModel",
    "opt": "OPTForCausalLM",
    "gpt_neox": "GPTNeoXForCausalLM",
    "phi": "PhiForCausalLM",
    "glm4": "Glm4ForCausalLM",
    "helium": "HeliumForCausalLM",
    "arcee": "ArceeForCausalLM",
    "exaone4": "Exaone4ForCausalLM",
    "gpt_bigcode": "GPTBigCodeForCausalLM",
    "qwen3_vl": "Qwen3VLForConditionalGeneration",
    "ernie4_5": "Ernie4_5ForCausalLM",
    "hunyuan": "HunYuanDenseV1ForCausalLM",
    "granite": "GraniteForCausalLM",
    "gpt_oss": "GptOssForCausalLM",
    "ernie4_5_moe": "Ernie4_5_MoeForCausalLM",
    "glm4_moe": "Glm4MoeForCausalLM",
    "hunyuan_moe": "HunYuanMoEV1ForCausalLM",
    "minimax_m2": "MiniMaxM2ForCausalLM",
    "dots1": "Dots1ForCausalLM",
    "qwen3_5": "Qwen3_5ForConditionalGeneration",
    "qwen3_5_moe": "Qwen3_5MoeForConditionalGeneration",
    "qwen3_5_text": "Qwen3_5ForCausalLM",
    "lfm2": "Lfm2ForCausalLM",
    "granitemoehybrid": "GraniteMoeHybridForCausalLM",
}
WINDOWS = {"mistral": 24, "gemma2": 48, "gemma3": 24, "gemma3_vl": 24, "olmo3": 24,
           "starcoder2": 24, "cohere2": 24, "exaone4": 24, "gpt_oss": 24}  # fmt: skip
"""Sliding windows shorter than the accuracy check's 72 positions and the prompts served."""
SHAPES: dict[str, dict[str, Any]] = {
    "qwen2": {
        "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0,
                            "original_max_position_embeddings": 64},
    },
    "mistral3": {
        "rope_parameters": {"rope_type": "yarn", "factor": 8.0, "rope_theta": 10000.0,
                            "original_max_position_embeddings": 32, "beta_fast": 32.0,
                            "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                            "llama_4_scaling_beta": 0.1},
    },
    "olmo": {"clip_qkv": 2.0},
    "ernie4_5": {"use_bias": True, "drawn_norms": True},
    "hunyuan": {"rope_parameters": {"rope_type": "dynamic", "alpha": 1000.0, "factor": 1.0,
                                    "rope_theta": 10000.0},
                "drawn_norms": True},
    "helium": {"head_dim": 16, "attention_bias": True},
    "granite": {"embedding_multiplier": 12.0, "residual_multiplier": 0.22,
                "attention_multiplier": 0.0078125, "logits_scaling": 8.0, "drawn_norms": True},
    "gpt_oss": {"head_dim": 16, "num_local_experts": 4, "num_experts_per_tok": 2,
                "intermediate_size": 64, "layer_types": ["sliding_attention", "full_attention"],
                "drawn_norms": True},
    "exaone4": {"head_dim": 16, "layer_types": ["sliding_attention", "full_attention"]},
    "smollm3": {"no_rope_layer_interval": 2},
    "stablelm": {"use_qkv_bias": True, "use_parallel_residual": True, "qk_layernorm": True,
                 "drawn_norms": True},
    "cohere": {"use_qk_norm": True, "drawn_norms": True},
    "starcoder2": {"tie_word_embeddings": True},
    "ernie4_5_moe": {"moe_num_experts": 4, "moe_k": 2, "moe_intermediate_size": 32,
                     "moe_num_shared_experts": 1, "drawn_norms": True},
    "glm4_moe": {"n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                 "n_shared_experts": 1, "routed_scaling_factor": 2.5, "attention_bias": True,
                 "use_qk_norm": True, "drawn_norms": True},
    "hunyuan_moe": {"num_experts": 4, "moe_topk": [2, 2], "drawn_norms": True},
    "minimax_m2": {"head_dim": 32, "rotary_dim": 16, "num_local_experts": 4,
                   "num_experts_per_tok": 2, "intermediate_size": 32, "drawn_norms": True},
    "dots1": {"head_dim": 16, "n_routed_experts": 4, "num_experts_per_tok": 2,
              "moe_intermediate_size": 32, "n_shared_experts": 1, "routed_scaling_factor": 2.5,
              "norm_topk_prob": True, "drawn_norms": True},
    "qwen3_moe": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                  "norm_topk_prob": True, "mlp_only_layers": [1]},
    "qwen3_5": {"drawn_norms": True},
    "qwen3_5_text": {"drawn_norms": True},
    "qwen3_5_moe": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                    "shared_expert_intermediate_size": 48, "drawn_norms": True},
    "lfm2": {"drawn_norms": True},
    "granitemoehybrid": {"embedding_multiplier": 12.0, "residual_multiplier": 0.22,
                         "attention_multiplier": 0.0078125, "logits_scaling": 8.0,
                         "drawn_norms": True},
}  # fmt: skip
"""Qwen2's long-context YaRN, its betas left to their defaults (as Qwen's own configs do);
Ministral 3's YaRN and its queries' temperature past 32 positions (without it, a logit
moves by 4); OLMo 7B 0424's clamped Q, K and V (``clip_qkv``: unclamped, a logit moves by 9);
Helium's biased Q, K and V (its interleaved RoPE: turned in halves, the check refuses it at
13.4); EXAONE 4.0's windowed layer with RoPE and global one without; SmolLM3's second layer
without RoPE (its every fourth, in a model of two); StableLM 2's Q, K and V biases, and 12B's
parallel layer and per-head Q/K LayerNorms (Command R+'s too: every norm's scale drawn, so a
head given another's would show); Starcoder2's tied head; Qwen3-MoE's four experts, two a
token, renormalized, and a dense second layer (``mlp_only_layers``); ERNIE 4.5's biases, and
its MoE's four experts, two a token, chosen on a drawn correction bias (without it, a logit
moves by 3.2), beside a shared expert, after a dense first layer; GLM-4.5's, chosen on its
sigmoid and a drawn bias (without it, a logit moves by 5.1), times 2.5 (without, 4.1), with Q/K
biases and per-head norms; HunYuan MoE's top 2 of 4 (given per layer) beside a shared MLP
(without it, a logit moves by 11.7); MiniMax-M2's sigmoid choice with its bias on the block
(without it, 7.1), Q/K norms across heads and RoPE on half of each head; dots.llm1's GLM-4.5
routing on Qwen 3's decoder; HunYuan's NTK-alpha RoPE (its Q/K norms after RoPE,
which is turned outside the attention node on positions read from the mask); Granite's four
multipliers; GPT-OSS's four experts, two a token, its attention sinks, YaRN and a windowed and
a global layer; Qwen 3.5's Gated DeltaNet layer before its gated attention one (and its MoE's
four experts beside a shared one; its text-only checkpoint, as a fine-tune saves it), and LFM2's
short convolution before its attention layer: hybrids whose first layer carries a recurrent
state, not a KV cache; Granite 4.0 Micro's attention layers and shared MLP, with Granite's
multipliers."""
SEEDS = {
    "gemma3": 1,
    "olmo2": 1,
    "starcoder2": 3,
    "stablelm": 4,
    "granite": 1,
    "qwen3_5": 2,
    "qwen3_5_text": 2,
}
"""Draws whose greedy continuation is a real sequence, not a loop of a few tokens (seed 7's)."""
FIGURES = ("equal_prefix", "top1_agreement", "max_abs_logit_diff", "reference_min_margin")
PHASES = ["validating", "converting", "optimizing", "checking accuracy", "ready"]


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory, tiny_models: Any) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sources")
    return {
        kind: tiny_models.causal(root / kind, kind, seed=SEEDS.get(kind, 7), **settings(kind))
        for kind in ARCHITECTURES
    }


def settings(kind: str) -> dict[str, Any]:
    windowed = {"sliding_window": WINDOWS[kind]} if kind in WINDOWS else {}
    return {**windowed, **SHAPES.get(kind, {})}


@pytest.fixture(scope="module")
def fp32(
    sources: dict[str, Path], tmp_path_factory: pytest.TempPathFactory, build_cli: Any
) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("fp32")
    kinds = list(sources)
    halves = [kinds[0::2], kinds[1::2]]  # two processes: each build is mostly one core's work

    def build(half: list[str]) -> Any:
        return build_cli.build_many(
            [(sources[k], out / k, ["--precision", "fp32", "--name", f"tiny-{k}"]) for k in half]
        )

    with ThreadPoolExecutor(2) as pool:
        runs = [run for half in pool.map(build, halves) for run in half]
    return dict(zip([k for half in halves for k in half], runs, strict=True))


@pytest.mark.parametrize("kind", list(ARCHITECTURES))
def test_fp32_greedy_equals_transformers(kind: str, fp32: dict[str, Any]) -> None:
    run = fp32[kind]
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.phases == PHASES
    report = run.last
    accuracy = report["accuracy"]
    print(kind, {k: accuracy[k] for k in FIGURES}, f"{report['seconds']} s")
    assert accuracy["type"] == "generate"
    assert accuracy["tokens"] == 32
    assert accuracy["built_ids"] == accuracy["reference_ids"]
    assert accuracy["equal_prefix"] == 32
    assert accuracy["first_divergence"] is None
    assert accuracy["top1_agreement"] == 1.0
    assert accuracy["max_abs_logit_diff"] < 1e-3
    # no near-ties: the closest call along the sequence is far wider than the builds' difference
    assert accuracy["reference_min_margin"] > 10 * accuracy["max_abs_logit_diff"]
    assert len(set(accuracy["reference_ids"])) >= 16  # a real sequence, not one token repeated
    folder = Path(report["out_dir"])
    assert json.loads((folder / "accuracy.json").read_text()) == accuracy
    manifest = report["manifest"]
    assert json.loads((folder / "kiln.json").read_text()) == manifest
    assert manifest["name"] == f"tiny-{kind}"
    assert manifest["task"] == "generate"
    assert manifest["engine"] == "onnxruntime-genai"
    assert manifest["architecture"] == ARCHITECTURES[kind]
    assert (manifest["precision"], manifest["target"]) == ("fp32", "cpu")
    assert manifest["stop_token_ids"] == [2]
    assert manifest["context_length"] == 256
    tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text())
    assert "<|im_start|>" in tokenizer_config["chat_template"]


@pytest.fixture(scope="module")
def quantized(
    sources: dict[str, Path], tmp_path_factory: pytest.TempPathFactory, build_cli: Any
) -> dict[str, tuple[Any, Path]]:
    """Llama at int4 and int8 and Qwen2 at int4 for CUDA, built in one process."""
    out = tmp_path_factory.mktemp("quantized")
    builds = {"int4": ("llama", []), "int8": ("llama", []), "cuda": ("qwen2", ["--target", "cuda"])}
    runs = build_cli.build_many([
        (sources[kind], out / name, ["--precision", "int8" if name == "int8" else "int4", *more])
        for name, (kind, more) in builds.items()
    ])  # fmt: skip
    return {name: (run, out / name) for name, run in zip(builds, runs, strict=True)}


@pytest.mark.parametrize("precision", ["int4", "int8"])
def test_quantized_build_reports_agreement(precision: str, quantized: dict[str, Any]) -> None:
    run, folder = quantized[precision]
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.phases == ["validating", "quantizing", "optimizing", "checking accuracy", "ready"]
    accuracy = run.last["accuracy"]
    print(precision, {k: accuracy[k] for k in FIGURES}, f"{run.last['seconds']} s")
    assert 0.0 <= accuracy["top1_agreement"] <= 1.0
    assert 0 <= accuracy["equal_prefix"] <= 32
    assert accuracy["max_abs_logit_diff"] > 1e-3  # weights really were quantized
    model = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    assert "MatMulNBits" in {node.op_type for node in model.graph.node}
    assert run.last["manifest"]["precision"] == precision


def test_cuda_target_builds_on_cpu(quantized: dict[str, Any]) -> None:
    run, out = quantized["cuda"]
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.last["accuracy"] == {"type": "skipped", "reason": "a cuda graph needs a GPU to run"}
    assert run.last["manifest"]["target"] == "cuda"
    genai = json.loads((out / "genai_config.json").read_text())
    providers = genai["model"]["decoder"]["session_options"]["provider_options"]
    assert any("cuda" in entry for entry in providers)
    model = onnx.load(str(out / "model.onnx"), load_external_data=False)
    ops = {node.op_type for node in model.graph.node}
    assert {"GroupQueryAttention", "MatMulNBits"} <= ops
    inputs = {i.name: i.type.tensor_type.elem_type for i in model.graph.input}
    assert inputs["past_key_values.0.key"] == onnx.TensorProto.FLOAT16  # fp16 KV cache on CUDA


@pytest.mark.gpu
def test_cuda_build_serves() -> None:
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("serving a CUDA-target build needs an NVIDIA GPU (no CUDA provider here)")
    pytest.fail("run the CUDA build through og.Generator on a GPU machine")  # not reached here


def test_prebuilt_genai_folder_is_taken_as_it_is(
    fp32: dict[str, Any], tmp_path: Path, build_cli: Any
) -> None:
    built = Path(fp32["llama"].last["out_dir"])
    detected = build_cli.build(built, None, "--detect")
    assert (detected.last["kind"], detected.last["task"]) == ("genai", "generate")
    run = build_cli.build(built, tmp_path / "copy", "--name", "prebuilt")
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.last["accuracy"]["type"] == "skipped"
    manifest = run.last["manifest"]
    assert (manifest["name"], manifest["target"], manifest["stop_token_ids"]) == (
        "prebuilt", "cpu", [2],
    )  # fmt: skip
    assert (tmp_path / "copy" / "model.onnx").read_bytes() == (built / "model.onnx").read_bytes()


def test_a_prebuilt_folder_the_runner_cannot_feed_is_refused(
    fp32: dict[str, Any], tmp_path: Path, build_cli: Any
) -> None:
    """A folder whose decoder takes ``position_ids`` (a Qwen2.5-VL folder the builder wrote
    without Kiln's mends) is refused naming the input, not served until its first request
    fails."""
    folder = tmp_path / "positions"
    shutil.copytree(Path(fp32["llama"].last["out_dir"]), folder)
    config = json.loads((folder / "genai_config.json").read_text())
    config["model"]["decoder"]["inputs"]["position_ids"] = "position_ids"
    (folder / "genai_config.json").write_text(json.dumps(config))
    run = build_cli.build(folder, tmp_path / "copy")
    assert run.returncode == 2
    assert (run.last["file"], run.last["field"]) == ("genai_config.json", "model.decoder.inputs")
    assert "does not feed (position_ids)" in run.last["error"]
    assert not (tmp_path / "copy").exists()


def test_a_prebuilt_folder_gets_its_sliding_window_on_every_layer(
    sources: dict[str, Path], tmp_path: Path, build_cli: Any
) -> None:
    """The builder's own Mistral folder names its window in ``genai_config.json`` only; taken
    as a prebuilt folder, its graph's attention gets it, as a build's does."""
    raw = tmp_path / "raw"
    subprocess.run(
        [sys.executable, "-m", "kiln_runtimes.build._builder", "-i", str(sources["mistral"]),
         "-o", str(raw), "-p", "fp32", "-e", "cpu", "-c", str(tmp_path / "cache")],
        check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    assert _windows(raw) == ({"window_size": WINDOWS["mistral"]}, {-1})
    run = build_cli.build(raw, tmp_path / "copy", "--name", "prebuilt-window")
    assert run.returncode == 0, run.stderr[-3000:]
    assert _windows(tmp_path / "copy") == ({}, {WINDOWS["mistral"]})
    assert _windows(raw)[1] == {-1}  # the source is left as it was


def _windows(folder: Path) -> tuple[dict[str, Any], set[int]]:
    """``genai_config.json``'s sliding window (its size) and the graph's attention windows."""
    decoder = json.loads((folder / "genai_config.json").read_text())["model"]["decoder"]
    window = {k: v for k, v in (decoder.get("sliding_window") or {}).items() if k == "window_size"}
    graph = onnx.load(str(folder / "model.onnx"), load_external_data=False).graph
    sizes = {a.i for n in graph.node if n.op_type == "GroupQueryAttention"
             for a in n.attribute if a.name == "local_window_size"}  # fmt: skip
    return window, sizes


@pytest.mark.parametrize("kind", ["llama", *WINDOWS, "opt", "hunyuan"])
async def test_an_fp32_build_scores_a_prompt_as_transformers(
    kind: str, fp32: dict[str, Any], sources: dict[str, Path], tiny_models: Any
) -> None:
    """``prompt_logprobs``: every prompt token's log-probability and top alternatives, scored
    over several prefill chunks and never from the prefix cache (a restored block has no
    logits), equal to transformers' log-softmax on the source weights; a model with a sliding
    window attends to no more than it, prefilled in chunks or restored from the cache; OPT's
    learned positions, read from the mask in the graph, are right in every chunk, and so are
    HunYuan's, which its RoPE reads outside the attention node."""
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    from kiln_runtimes.backends.base import EngineOptions
    from kiln_runtimes.backends.genai import GenAIGenerationBackend
    from kiln_runtimes.protocol import MANIFEST_NAME, GenerateRequest, ModelManifest

    folder = Path(fp32[kind].last["out_dir"])
    text = " ".join(tiny_models.SENTENCES * 3)  # what its tokenizer was trained on
    prompt = Tokenizer.from_file(str(folder / "tokenizer.json")).encode(text).ids[:70]
    manifest = msgspec.json.decode((folder / MANIFEST_NAME).read_bytes(), type=ModelManifest)
    backend = GenAIGenerationBackend(EngineOptions(max_batch_size=2, prefix_cache_bytes=1 << 20),
                                     prefill_chunk=16)  # fmt: skip
    await backends.start(backend, folder, manifest, None)
    try:
        chunks = []
        for n, scored in enumerate((None, 3, None)):  # the first fills the prefix cache
            request = GenerateRequest(request_id=f"s{n}", prompt_ids=prompt, max_tokens=2,
                                      temperature=0.0, prompt_logprobs=scored)  # fmt: skip
            chunks.append([chunk async for chunk in backend.stream(request)])
    finally:
        backend.unload()
    plain, scoring, again = chunks
    assert plain[0].prompt_logprobs is None
    assert (plain[-1].cached_tokens, scoring[-1].cached_tokens) == (0, 0)
    assert again[-1].cached_tokens == 64  # what the scoring request did not take
    got = scoring[0].prompt_logprobs
    assert got is not None
    assert len(got) == len(prompt) - 1
    assert all(c.prompt_logprobs is None for c in scoring[1:])
    model = AutoModelForCausalLM.from_pretrained(sources[kind], torch_dtype=torch.float32)
    with torch.no_grad():
        want = torch.log_softmax(model(torch.tensor([prompt])).logits[0], -1)
    said = [[t for chunk in run for t in chunk.token_ids] for run in chunks]
    assert said[0] == said[2]  # restored from the cache as prefilled
    assert said[0][0] == int(want[-1].argmax())
    for position, (entry, token) in enumerate(zip(got, prompt[1:], strict=True)):
        row = want[position]
        assert abs(entry.logprob - float(row[token])) < 1e-3, position
        above = int((row > row[token] + 1e-4).sum()) + 1  # surely more probable: before it
        tied = int(((row - row[token]).abs() <= 1e-4).sum())  # within the builds' difference
        assert above <= entry.rank <= above + tied - 1
        assert entry.top_ids == row.topk(3).indices.tolist()
        assert max(abs(a - float(row[i])) for a, i in zip(entry.top_logprobs, entry.top_ids,
                                                            strict=True)) < 1e-3  # fmt: skip


@pytest.mark.parametrize("kind", ["qwen3_5", "lfm2"])
async def test_a_hybrids_concurrent_streams_equal_transformers(
    kind: str, fp32: dict[str, Any], sources: dict[str, Path], tiny_models: Any
) -> None:
    """A hybrid's recurrent states through Kiln's runner: five greedy streams on three slots at
    once, prefilled in chunks (6 tokens a step while others decode), equal transformers' each
    alone. A decode step also steps rows that are not decoding (a row between its prefill's
    chunks), whose states must not move, and a slot taken again starts from zero states. The
    prefix cache keeps a block's states at its end, where a chunk is made to end: a prompt
    again, and one sharing two blocks of another, restore them and answer the same. Adapter
    slots are left off (the model is served, an adapter request refused)."""
    import torch
    import transformers
    from tokenizers import Tokenizer

    from kiln_runtimes.backends.base import EngineOptions
    from kiln_runtimes.backends.genai import GenAIGenerationBackend
    from kiln_runtimes.protocol import MANIFEST_NAME, GenerateRequest, ModelManifest

    folder = Path(fp32[kind].last["out_dir"])
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    texts = [" ".join(tiny_models.SENTENCES[i:] * 3) for i in range(4)]
    prompts = [tokenizer.encode(text).ids[: 60 - 13 * i] for i, text in enumerate(texts)]
    prompts.append(prompts[2])  # on a slot another stream held
    later = [prompts[2], prompts[0][:40] + prompts[1][:9]]  # 32 tokens of each in the cache
    manifest = msgspec.json.decode((folder / MANIFEST_NAME).read_bytes(), type=ModelManifest)
    options = EngineOptions(max_batch_size=3, prefix_cache_bytes=1 << 20, adapter_slots=2,
                            decoding_prefill=6)  # fmt: skip
    backend = GenAIGenerationBackend(options, prefill_chunk=16)

    async def stream(prompt: list[int], n: int) -> tuple[list[int], int]:
        await asyncio.sleep(0.002 * n)
        request = GenerateRequest(request_id=f"h{n}-{len(prompt)}", prompt_ids=prompt,
                                  max_tokens=20, temperature=0.0, ignore_eos=True)  # fmt: skip
        chunks = [chunk async for chunk in backend.stream(request)]
        return [t for chunk in chunks for t in chunk.token_ids], chunks[-1].cached_tokens

    await backends.start(backend, folder, manifest, None)  # its adapter slots left off
    try:
        got = await asyncio.gather(*(stream(p, n) for n, p in enumerate(prompts)))
        got += [await stream(prompt, 0) for prompt in later]
        with pytest.raises(ValueError, match="without adapter slots"):
            backend.stream(
                GenerateRequest(request_id="a", prompt_ids=prompts[0], max_tokens=1, adapter="x")
            )
    finally:
        backend.unload()
    architecture = ARCHITECTURES[kind]
    model_class = getattr(transformers, architecture) if kind == "qwen3_5" else \
        transformers.AutoModelForCausalLM  # fmt: skip
    model = model_class.from_pretrained(sources[kind], dtype=torch.float32).eval()
    assert [cached for _, cached in got[-2:]] == [32, 32]
    for (said, _), prompt in zip(got, [*prompts, *later], strict=True):
        with torch.no_grad():
            want = model.generate(torch.tensor([prompt]), max_new_tokens=20, min_new_tokens=20,
                                  do_sample=False)[0, len(prompt) :].tolist()  # fmt: skip
        assert said == want
