"""A sentence-transformers folder's pooling, dense layers and normalization, read from its
module files."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from kiln_runtimes.build._options import BuildError
from kiln_runtimes.build._source import read_json

if TYPE_CHECKING:
    from pathlib import Path

MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
"""sentence-transformers' pooling modes; the legacy ``pooling_mode_*`` flags concatenate in this
order."""
_FLAGS = {"pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max",
          "pooling_mode_mean_tokens": "mean",
          "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
          "pooling_mode_weightedmean_tokens": "weightedmean",
          "pooling_mode_lasttoken": "lasttoken"}  # fmt: skip


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


def read_head(folder: Path) -> Head:
    """The folder's head; a bare encoder (no ``modules.json``) pools by mean, unnormalized,
    which is what sentence-transformers does when it loads one."""
    if not (folder / "modules.json").is_file():
        return Head()
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
    pooling = "mean"
    if "Pooling" in kinds:
        pooling = pooling_mode(read_json(folder / kinds["Pooling"] / "config.json"))
    dense = tuple(path for kind, path in order if kind == "Dense")
    return Head(encoder_dir=kinds["Transformer"], pooling=pooling, dense=dense,
                normalize="Normalize" in kinds)  # fmt: skip


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
