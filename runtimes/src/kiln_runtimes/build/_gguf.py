"""GGUF checkpoints: checked with ``gguf``, dequantized to a Hugging Face folder by transformers."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kiln_runtimes.build._checks import TEMPLATE_NAME
from kiln_runtimes.build._options import BuildError

if TYPE_CHECKING:
    from pathlib import Path

# transformers loads tensors with ``gguf.dequantize``: these two as they are, others through a
# ``gguf.quants`` dequantizer (Q8_1, Q8_K, I8... have none and fail deep in the load).
_PLAIN_TYPES = frozenset({"F32", "F16"})
LLAMA_CPP_NAMES = {"qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe", "gpt-oss": "gpt_oss",
                   "minimax-m2": "minimax_m2"}  # fmt: skip
"""llama.cpp's names of architectures transformers lists under its own (and reads as them)."""


def inspect(path: Path) -> int:
    """Check the file can be loaded by transformers; return its parameter count."""
    import gguf
    import gguf.quants
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    try:
        reader = gguf.GGUFReader(str(path))
    except (ValueError, OSError, IndexError, KeyError) as exc:
        raise BuildError(f"not a readable GGUF file: {exc}", file=path.name) from exc
    field = reader.get_field("general.architecture")
    architecture = field.contents() if field is not None else None
    supported = set(GGUF_SUPPORTED_ARCHITECTURES) - {"general", "tokenizer"}  # mapping sections
    if architecture not in supported and LLAMA_CPP_NAMES.get(str(architecture)) not in supported:
        raise BuildError(
            f"GGUF architecture {architecture!r} cannot be loaded by transformers "
            f"(supported: {', '.join(sorted(supported))})",
            file=path.name,
            field="general.architecture",
        )
    dequantizable = _PLAIN_TYPES | {kind.name for kind in gguf.quants._type_traits}
    for tensor in reader.tensors:
        kind = tensor.tensor_type.name
        if kind not in dequantizable:
            raise BuildError(
                f"tensor {tensor.name} is {kind}, a GGUF quantization type transformers cannot "
                f"dequantize (supported: {', '.join(sorted(dequantizable))})",
                file=path.name,
                field=tensor.name,
            )
    return sum(int(tensor.n_elements) for tensor in reader.tensors)


def to_hf(path: Path, hf_dir: Path) -> None:
    """Dequantize the GGUF into a clean fp32 checkpoint of its own architecture plus tokenizer.

    The loaded config carries the GGUF quantization settings; a fresh config of the same class
    without them, and the weights moved over, make a folder the builder reads as plain fp32.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        loaded = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name)
    except RuntimeError as exc:  # its weights unlike the config it read from the metadata
        if "mismatch" not in str(exc):
            raise
        raise BuildError(
            "transformers read a configuration from this GGUF's metadata that its tensors do "
            "not match (a size it does not map from llama.cpp's keys, and took its default)",
            file=path.name,
        ) from exc
    settings = loaded.config.to_dict()
    for key in ("quantization_config", "_model_name_or_path", "transformers_version"):
        settings.pop(key, None)
    settings["dtype"] = "float32"
    config = type(loaded.config)(**settings)
    with torch.device("meta"):
        fresh = type(loaded)(config)
    fresh.load_state_dict(loaded.state_dict(), assign=True, strict=True)
    fresh.tie_weights()
    fresh.save_pretrained(hf_dir)
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    tokenizer.save_pretrained(hf_dir)
    for name, template in named_templates(path).items():  # transformers reads the default only
        (hf_dir / "additional_chat_templates").mkdir(exist_ok=True)
        (hf_dir / "additional_chat_templates" / f"{name}.jinja").write_text(template)


def named_templates(path: Path) -> dict[str, str]:
    """The GGUF's named chat templates besides its default (llama.cpp's
    ``tokenizer.chat_template.<name>``: ``tool_use``, ``rag``)."""
    import gguf

    prefix = "tokenizer.chat_template."
    found = {}
    for key, field in gguf.GGUFReader(str(path)).fields.items():
        name = key.removeprefix(prefix)
        if key.startswith(prefix) and TEMPLATE_NAME.fullmatch(name):
            value = field.contents()
            if isinstance(value, str) and value:
                found[name] = value
    return found
