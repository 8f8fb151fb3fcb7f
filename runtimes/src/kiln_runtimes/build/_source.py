"""What a source is and which task it serves, read from its files (no model library imported)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import msgspec

from kiln_runtimes.build._kilns import VISION_TEXT
from kiln_runtimes.build._options import BuildError
from kiln_runtimes.protocol import Task

Kind = Literal["hf", "gguf", "genai", "tensor"]
# Encoders sentence-transformers wraps; a bare one of these is an embeddings model too (and a
# sequence classifier, a cross-encoder of one label or a classifier of more, serves the
# embeddings task's scores or probabilities).
ENCODER_TYPES = frozenset({"bert", "roberta", "xlm-roberta", "distilbert", "mpnet", "electra"})
ENCODER_ARCHITECTURES = frozenset(
    {"BertModel", "RobertaModel", "XLMRobertaModel", "DistilBertModel", "MPNetModel"}
)


class Source(msgspec.Struct, frozen=True, kw_only=True):
    """A detected source: its kind, the task it serves and its architecture if it names one."""

    kind: Kind
    path: str
    task: Task
    architecture: str | None = None


def detect(path: Path, task: Task | None = None) -> Source:
    """Tell what ``path`` is; an explicit ``task`` overrides what the files suggest."""
    if not path.exists():
        raise BuildError("the source does not exist", file=str(path))
    if path.is_file():
        return _detect_file(path, task)
    if (path / "genai_config.json").is_file():
        return _fixed(path, "genai", "generate", task)
    if (path / "config.json").is_file():
        config = read_json(path / "config.json")
        architecture = first_architecture(config)
        found = task or task_for(config, has_modules=(path / "modules.json").is_file())
        if found is None:
            raise BuildError(
                f"cannot tell the task from architecture {architecture!r}: a generation model "
                "is *ForCausalLM (or GPT2LMHeadModel, Gemma 3's or Mistral 3's "
                "*ForConditionalGeneration), an embeddings model a BERT-family "
                "encoder or a "
                "*ForSequenceClassification (a cross-encoder of one label, a classifier of "
                "more) (pass --task)",
                file="config.json",
                field="architectures",
            )
        return Source(kind="hf", path=str(path), task=found, architecture=architecture)
    if any(path.glob("*.onnx")):
        return _fixed(path, "tensor", "tensor", task)
    raise BuildError(
        "not a model folder: no config.json (Hugging Face), genai_config.json (ONNX Runtime "
        "GenAI) or *.onnx",
        file="config.json",
    )


def task_for(config: dict[str, Any], *, has_modules: bool) -> Task | None:
    """The task a Hugging Face ``config.json`` implies, or None if it implies none."""
    architecture = first_architecture(config) or ""
    if architecture.endswith(("ForCausalLM", "LMHeadModel")) or architecture in VISION_TEXT:
        return "generate"  # GPT-2's: GPT2LMHeadModel; a vision model's text decoder
    if has_modules or architecture in ENCODER_ARCHITECTURES or classes(config):
        return "embeddings"
    if not architecture and config.get("model_type") in ENCODER_TYPES:
        return "embeddings"
    return None


def classes(config: dict[str, Any]) -> int:
    """The labels of a sequence classifier's ``config.json`` (transformers' default, 2, when it
    names none); 0 for any other architecture."""
    if not (first_architecture(config) or "").endswith("ForSequenceClassification"):
        return 0
    return int(config.get("num_labels") or len(config.get("id2label") or {}) or 2)


def first_architecture(config: dict[str, Any]) -> str | None:
    """``architectures[0]`` of a ``config.json``, if it has one."""
    names = config.get("architectures")
    if isinstance(names, list) and names and isinstance(names[0], str):
        return names[0]
    return None


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from ``path``; a missing or malformed file is the user's error."""
    if not path.is_file():
        raise BuildError("file not found", file=path.name)
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BuildError(f"not valid JSON: {exc}", file=path.name) from exc
    if not isinstance(value, dict):
        raise BuildError("expected a JSON object", file=path.name)
    return value


def _detect_file(path: Path, task: Task | None) -> Source:
    """A single file: a GGUF checkpoint or an ONNX tensor model."""
    suffix = path.suffix.lower()
    if suffix == ".gguf":
        return _fixed(path, "gguf", "generate", task)
    if suffix == ".onnx":
        return _fixed(path, "tensor", "tensor", task)
    raise BuildError("a single-file source must be .gguf or .onnx", file=path.name)


def _fixed(path: Path, kind: Kind, serves: Task, task: Task | None) -> Source:
    """A source that serves one task only; asking for another is an error."""
    if task is not None and task != serves:
        raise BuildError(
            f"a {kind} source serves {serves}, not {task}", file=path.name, field="task"
        )
    return Source(kind=kind, path=str(path), task=serves)
