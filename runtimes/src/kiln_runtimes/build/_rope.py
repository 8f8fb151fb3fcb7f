"""RoPE for the builder (:mod:`._builder`): YaRN's as transformers computes it
(``_compute_yarn_parameters``), its inverse frequencies and the scale of its cos and sin; and
a layer made without RoPE or without the model's window (:func:`without`)."""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterator

    import torch

BETA_FAST, BETA_SLOW = 32.0, 1.0
"""transformers' defaults when the config leaves them out (or gives 0)."""


def ntk(params: dict[str, Any], factor: float) -> dict[str, Any]:
    """The builder's ``rescale_inv_freq`` for YaRN, with transformers' defaults."""
    return {
        "factor": factor,
        "ntk_alpha": params.get("beta_slow") or BETA_SLOW,
        "ntk_beta": params.get("beta_fast") or BETA_FAST,
        "truncate": params.get("truncate", True),
    }


def attention_factor(params: dict[str, Any], factor: float) -> float:
    """What cos and sin are multiplied by: ``attention_factor`` if given, else the ratio of
    ``mscale`` to ``mscale_all_dim`` when both are given, else ``0.1 ln(factor) + 1``."""
    if params.get("attention_factor") is not None:
        return float(params["attention_factor"])

    def scale(mscale: float = 1.0) -> float:
        return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0

    mscale, all_dim = params.get("mscale"), params.get("mscale_all_dim")
    return scale(mscale) / scale(all_dim) if mscale and all_dim else scale()


def inv_freq(plain: torch.Tensor, rescale: dict[str, Any], theta: float, original: int) -> Any:
    """``plain`` (RoPE's inverse frequencies, one per pair of rotary dimensions) ramped from
    extrapolated (fast dimensions) to interpolated by ``factor`` (slow ones) between the
    correction range of ``beta_fast`` and ``beta_slow`` rotations in ``original`` positions."""
    import torch

    dim = 2 * plain.shape[0]

    def correction(rotations: float) -> float:
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction(rescale["ntk_beta"]), correction(rescale["ntk_alpha"])
    if rescale["truncate"]:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolated = 1 - ramp
    return plain / rescale["factor"] * (1 - extrapolated) + plain * extrapolated


@contextmanager
def without(model: Any, *, rope: bool, window: bool = False) -> Iterator[None]:
    """While a layer is made: the builder's ``model`` without RoPE if ``rope`` (SmolLM3's,
    Command R7B's and EXAONE 4.0's layers that turn none), without its sliding window if
    ``window`` (their global layers, where the builder windows every one)."""
    attrs = model.attention_attrs
    kept = attrs["rope"], attrs["use_rope_in_attn"], model.window_size
    if rope:
        attrs["rope"] = attrs["use_rope_in_attn"] = False
    if window:
        model.window_size = -1
    try:
        yield
    finally:
        attrs["rope"], attrs["use_rope_in_attn"], model.window_size = kept
