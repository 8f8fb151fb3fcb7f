"""A sentence-transformers folder's pooling, dense layers, normalization and prompts, read
from its module files and ``config_sentence_transformers.json``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from kiln_runtimes.build._options import BuildError
from kiln_runtimes.build._source import read_json

if TYPE_CHECKING:
    from pathlib import Path

_FLAGS = {"pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max",
          "pooling_mode_mean_tokens": "mean",
          "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
          "pooling_mode_weightedmean_tokens": "weightedmean",
          "pooling_mode_lasttoken": "lasttoken"}  # fmt: skip
MODES = tuple(_FLAGS.values())
"""sentence-transformers' pooling modes, in the order its legacy flags concatenate them."""


MODULES = ("Transformer", "Pooling", "Dense", "Normalize")
"""The sentence-transformers modules an embeddings graph is built of."""


class Head(msgspec.Struct, frozen=True, kw_only=True):
    """Where the encoder lives in the folder, how its token states pool, the dense layers after
    the pooling (their folders, in order) and whether to normalize."""

    encoder_dir: str = ""
    pooling: str = "mean"
    """The pooling modes, ``+``-joined when several are concatenated (``cls+mean``)."""
    dense: tuple[str, ...] = ()
    normalize: bool = False
    prompts: dict[str, str] = {}
    """Named prefixes a text may be embedded with (``query: ``), as the folder names them."""
    default_prompt_name: str | None = None
    """The prompt every text gets unless another is named, as ``SentenceTransformer.encode``."""
    lowercase: bool = False
    """``sentence_bert_config.json``'s ``do_lower_case``: texts are lowercased first."""


def read_head(folder: Path) -> Head:
    """The folder's head; a bare encoder (no ``modules.json``) pools by mean, unnormalized,
    which is what sentence-transformers does when it loads one."""
    if not (folder / "modules.json").is_file():
        return Head(**_prompts(folder, include_prompt=True))
    modules = msgspec.json.decode((folder / "modules.json").read_bytes(), type=list[dict[str, Any]])
    order = [(str(m.get("type", "")).rsplit(".", 1)[-1], str(m.get("path", ""))) for m in modules]
    kinds = dict(order)
    unknown = [kind for kind, _ in order if kind not in MODULES]
    if unknown:
        raise BuildError(
            f"module {unknown[0]} cannot be built: an embeddings graph is made of "
            f"{', '.join(MODULES)}", file="modules.json", field="type",
        )  # fmt: skip
    if "Transformer" not in kinds:
        raise BuildError("no Transformer module", file="modules.json", field="type")
    if "Normalize" in kinds and order[-1][0] != "Normalize":
        raise BuildError("Normalize must be the last module", file="modules.json", field="type")
    config = read_json(folder / kinds["Pooling"] / "config.json") if "Pooling" in kinds else {}
    prompts = _prompts(folder, include_prompt=config.get("include_prompt") is not False)
    dense = tuple(path for kind, path in order if kind == "Dense")
    encoder = folder / kinds["Transformer"] / "sentence_bert_config.json"
    lowercase = encoder.is_file() and read_json(encoder).get("do_lower_case") is True
    return Head(encoder_dir=kinds["Transformer"], pooling=pooling_mode(config), dense=dense,
                normalize="Normalize" in kinds, lowercase=lowercase, **prompts)  # fmt: skip


def _prompts(folder: Path, *, include_prompt: bool) -> dict[str, Any]:
    """``config_sentence_transformers.json``'s ``prompts`` and ``default_prompt_name``. A
    pooling that leaves the prompt's tokens out (``include_prompt: false``, INSTRUCTOR's) is not
    built: with a default prompt the folder is refused, without one its prompts are dropped."""
    path = folder / "config_sentence_transformers.json"
    config = read_json(path) if path.is_file() else {}
    prompts, default = config.get("prompts") or {}, config.get("default_prompt_name")
    where = {"file": path.name}
    if not isinstance(prompts, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()
    ):
        raise BuildError("prompts must map names to strings", field="prompts", **where)
    if default is not None and default not in prompts:
        raise BuildError(f"default_prompt_name {default!r} is not one of the prompts",
                         field="default_prompt_name", **where)  # fmt: skip
    if not include_prompt and default is not None and prompts[default]:
        raise BuildError(
            "a pooling without the prompt's tokens (include_prompt: false) cannot be built with a "
            "default prompt", file="1_Pooling/config.json", field="include_prompt",
        )  # fmt: skip
    return {"prompts": prompts, "default_prompt_name": default} if include_prompt else {}


def pooling_mode(config: dict[str, Any]) -> str:
    """The pooling a ``1_Pooling/config.json`` asks for, read as sentence-transformers reads it:
    ``pooling_mode`` (a mode or a list of modes, concatenated in its order), else the legacy
    ``pooling_mode_*`` flags (in their fixed order), else mean."""
    named = config.get("pooling_mode")
    if named is None:
        modes = [mode for flag, mode in _FLAGS.items() if config.get(flag)] or ["mean"]
    else:
        modes = [named] if isinstance(named, str) else named
    if not isinstance(modes, list) or not modes or any(m not in MODES for m in modes):
        raise BuildError(
            f"pooling_mode must be one or more of {', '.join(MODES)} (found {named!r})",
            file="1_Pooling/config.json", field="pooling_mode",
        )  # fmt: skip
    return "+".join(modes)


def matryoshka(config: dict[str, Any], width: int) -> list[int] | None:
    """The widths an encoder's ``config.json`` says its embeddings may be cut to (vLLM's keys:
    ``matryoshka_dimensions``, or ``is_matryoshka`` for any: ``[]``); ``None`` if it says none."""
    widths = config.get("matryoshka_dimensions")
    if widths is None:
        return [] if config.get("is_matryoshka") is True else None
    if not isinstance(widths, list) or not all(
        isinstance(w, int) and not isinstance(w, bool) and 0 < w <= width for w in widths
    ):
        raise BuildError(f"must be a list of widths from 1 to the model's {width}",
                         file="config.json", field="matryoshka_dimensions")  # fmt: skip
    return sorted(set(widths), reverse=True)
