"""The architectures Kiln's mends add to the onnxruntime-genai builder's own, each read under
the name of one it builds (its host), whose class ``_builder.by_model_type`` swaps for Kiln's.
Torch-free: the checks before a build read it (``_checks.builder_architectures``)."""

from __future__ import annotations

LLAMA, MISTRAL = "LlamaForCausalLM", "MistralForCausalLM"
HOSTS = {
    "Olmo2ForCausalLM": "OlmoForCausalLM", "Olmo3ForCausalLM": "OlmoForCausalLM",
    "OlmoeForCausalLM": "OlmoForCausalLM", "Exaone4ForCausalLM": "OlmoForCausalLM",
    "StableLmForCausalLM": LLAMA, "Starcoder2ForCausalLM": LLAMA, "CohereForCausalLM": LLAMA,
    "Cohere2ForCausalLM": LLAMA, "GPT2LMHeadModel": LLAMA, "OPTForCausalLM": LLAMA,
    "GPTBigCodeForCausalLM": LLAMA,
    "GPTNeoXForCausalLM": LLAMA, "FalconForCausalLM": LLAMA, "GlmForCausalLM": LLAMA,
    "Glm4ForCausalLM": LLAMA, "HeliumForCausalLM": LLAMA, "SeedOssForCausalLM": LLAMA,
    "ArceeForCausalLM": LLAMA, "ApertusForCausalLM": LLAMA, "MinistralForCausalLM": MISTRAL,
    "Ministral3ForCausalLM": MISTRAL,
    "MixtralForCausalLM": MISTRAL, "Qwen2MoeForCausalLM": "Qwen2ForCausalLM",
    "Qwen3MoeForCausalLM": "Qwen3ForCausalLM", "GraniteMoeForCausalLM": "GraniteForCausalLM",
    "Ernie4_5_MoeForCausalLM": "Ernie4_5ForCausalLM", "Glm4MoeForCausalLM": LLAMA,
    "HunYuanMoEV1ForCausalLM": "HunYuanDenseV1ForCausalLM", "MiniMaxM2ForCausalLM": LLAMA,
    "Dots1ForCausalLM": LLAMA, "Qwen3_5ForCausalLM": "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForCausalLM": "Qwen3_5MoeForConditionalGeneration",
}  # fmt: skip
"""Kiln's architecture -> the builder's: OLMo 2 and 3, OLMoE and EXAONE 4.0 as OLMo
(``_olmo2``, ``_moe``, ``_exaone``); StableLM, Starcoder2, Command R and R7B, GPT-2,
GPTBigCode, OPT, GPT-NeoX, Falcon, GLM and GLM-4, Arcee's AFM, Apertus and Helium as Llama
(Seed-OSS is Llama's decoder, its optional biases too); Ministral (windows on some layers, which
the builder reads from ``layer_types``) and Ministral 3 (``_mistral3``) as Mistral; the
mixtures of experts as their dense hosts (``_moe``); Qwen 3.5's text-only checkpoints (what
``AutoModelForCausalLM`` loads and a fine-tune saves) as its vision-language one, whose
builder reads the text config either way."""
VISION_TEXT = frozenset({
    "Gemma3ForConditionalGeneration", "Mistral3ForConditionalGeneration",
    "Qwen2_5_VLForConditionalGeneration", "Qwen3VLForConditionalGeneration",
    "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration",
})  # fmt: skip
"""Vision-language checkpoints whose text decoder the builder exports and Kiln serves, text in
and out (an image in a request is refused): Gemma 3 4B-27B, Mistral Small 3.1/3.2, Ministral 3
and Magistral (``_mistral3``), Qwen2.5-VL, Qwen3-VL and Qwen 3.5 and its MoE (``_qwen_vl``;
hybrids whose Gated DeltaNet layers carry recurrent states). Whisper, an encoder-decoder the
builder takes too, is left out."""
