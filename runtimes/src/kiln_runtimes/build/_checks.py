"""Checks of a Hugging Face folder before anything heavy runs; each failure names its file."""

from __future__ import annotations

import functools
import importlib.util
import json
import math
import re
import struct
from pathlib import Path
from typing import Any

from kiln_runtimes.build._kilns import HOSTS, VISION_TEXT
from kiln_runtimes.build._options import BuildError

_HEADER_LIMIT = 100 * 1024 * 1024  # the safetensors format's own cap on the JSON header
_BUILDER_BRANCH = re.compile(
    r'config\.architectures\[0\] == "(\w+For(?:CausalLM|ConditionalGeneration))"'
)


@functools.cache
def builder_architectures() -> frozenset[str]:
    """The ``*ForCausalLM`` architectures the installed onnxruntime-genai builder exports, the
    vision-language ones whose text decoder it exports and Kiln serves
    (:data:`._kilns.VISION_TEXT`), and those Kiln's mends add.

    Read from the builder's own dispatch (``config.architectures[0] == "..."``) without
    importing it (that imports torch), so the list follows the installed version.
    """
    spec = importlib.util.find_spec("onnxruntime_genai")
    if spec is None or not spec.submodule_search_locations:
        raise BuildError("onnxruntime-genai is not installed (the runtimes[import] extra)")
    for location in spec.submodule_search_locations:
        builder = Path(location) / "models" / "builder.py"
        if builder.is_file():
            branches = _BUILDER_BRANCH.findall(builder.read_text("utf-8"))
            decoders = {b for b in branches if b.endswith("ForCausalLM") or b in VISION_TEXT}
            return frozenset(HOSTS) | frozenset(decoders)
    raise BuildError("onnxruntime_genai/models/builder.py not found")


def check_architecture(architecture: str | None) -> str:
    """Refuse an architecture the builder cannot export, naming ``config.json``."""
    supported = builder_architectures()
    if architecture not in supported:
        raise BuildError(
            f"architecture {architecture!r} is not supported by the onnxruntime-genai builder "
            f"(supported: {', '.join(sorted(supported))})",
            file="config.json",
            field="architectures",
        )
    return architecture


def check_tokenizer(folder: Path, *, chat: bool) -> None:
    """The gateway tokenizes with ``tokenizer.json``; chat needs a template too."""
    if not (folder / "tokenizer.json").is_file():
        raise BuildError(
            "file not found: the gateway tokenizes with a fast tokenizer's tokenizer.json",
            file="tokenizer.json",
        )
    if not chat:
        return
    if not (folder / "tokenizer_config.json").is_file():
        raise BuildError("file not found", file="tokenizer_config.json")
    if chat_template(folder) is None:
        raise BuildError(
            "no chat template (tokenizer_config.json, chat_template.jinja or "
            "chat_template.json): chat completions cannot format messages",
            file="tokenizer_config.json",
            field="chat_template",
        )


TEMPLATE_NAME = re.compile(r"[\w.-]+")
"""A named chat template's name fit for a file (``additional_chat_templates/<name>.jinja``)."""


def chat_template(folder: Path) -> str | None:
    """The chat template ``apply_chat_template`` uses without a name or tools: the folder's
    ``default`` one."""
    return chat_templates(folder).get("default")


def chat_templates(folder: Path) -> dict[str, str]:
    """The chat templates wherever this folder keeps them, by name: ``default`` (its only one,
    or the one so named in a list of named ones, Hermes' and Command R's) and the others
    (``tool_use``, ``rag``), from that list or ``additional_chat_templates/*.jinja``."""
    extra = folder / "additional_chat_templates"
    found = {p.stem: p.read_text(encoding="utf-8") for p in sorted(extra.glob("*.jinja"))}
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return found | {"default": jinja.read_text(encoding="utf-8")}
    for name in ("tokenizer_config.json", "chat_template.json"):
        path = folder / name
        if path.is_file():
            try:
                template = json.loads(path.read_text(encoding="utf-8")).get("chat_template")
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise BuildError(f"not valid JSON: {exc}", file=name) from exc
            if isinstance(template, list):
                named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
                kept = {k: v for k, v in named.items() if isinstance(k, str) and isinstance(v, str)}
                if kept:
                    return found | kept
            if isinstance(template, str) and template:
                return found | {"default": template}
    return found


def weight_parameters(folder: Path) -> int:
    """Total parameters in the folder's safetensors files, each checked for corruption."""
    files = sorted(folder.glob("*.safetensors"))
    pickled = sorted(
        p.name for pattern in ("*.bin", "*.pt", "*.pth") for p in folder.glob(pattern)
        if p.name != "training_args.bin"  # the trainer's settings, not weights
    )  # fmt: skip
    if not files and pickled:
        raise BuildError(
            f"{pickled[0]} is pickled weights, which are not loaded (unpickling can run code): "
            "save them as safetensors (safetensors.torch.save_file, or transformers' "
            "save_pretrained) and import again", file=pickled[0],
        )  # fmt: skip
    if not files:
        raise BuildError("no *.safetensors weights in the folder", file="model.safetensors")
    return sum(safetensors_parameters(path) for path in files)


def safetensors_parameters(path: Path) -> int:
    """Parameters in one safetensors file; a header or size that does not add up is refused."""
    size = path.stat().st_size
    with path.open("rb") as handle:
        raw = handle.read(8)
        if len(raw) < 8:
            raise BuildError("truncated: no header length", file=path.name, field="header")
        (length,) = struct.unpack("<Q", raw)
        if length > min(_HEADER_LIMIT, size - 8):
            raise BuildError(
                f"corrupt: header length {length} exceeds the file", file=path.name, field="header"
            )
        header_bytes = handle.read(length)
    return _parameters(header_bytes, size - 8 - length, path.name)


def _parameters(header_bytes: bytes, data_size: int, name: str) -> int:
    """Parameters described by a safetensors header whose data section has ``data_size`` bytes."""
    try:
        header: dict[str, Any] = json.loads(header_bytes)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BuildError(f"corrupt: header is not JSON ({exc})", file=name, field="header") from exc
    total, end = 0, 0
    for tensor, info in header.items():
        if tensor == "__metadata__":
            continue
        try:
            begin, stop = (int(x) for x in info["data_offsets"])
            count = math.prod(int(d) for d in info["shape"])
        except (KeyError, TypeError, ValueError) as exc:
            raise BuildError(f"corrupt tensor entry: {exc}", file=name, field=tensor) from exc
        if not 0 <= begin <= stop <= data_size:
            raise BuildError(
                f"corrupt: data offsets [{begin}, {stop}] outside the {data_size}-byte data",
                file=name,
                field=tensor,
            )
        total += count
        end = max(end, stop)
    if end != data_size:
        raise BuildError(
            f"corrupt: tensors cover {end} of {data_size} data bytes (truncated or padded)",
            file=name,
            field="data",
        )
    return total
