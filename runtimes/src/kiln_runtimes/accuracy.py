"""A build's accuracy report (``accuracy.json``, the last line of a build): the built graph
against its source framework on fixed inputs, tagged by ``type``."""

from __future__ import annotations

import msgspec


class GenerateAccuracy(msgspec.Struct, frozen=True, kw_only=True, tag="generate"):
    """A generation build against transformers on one fixed prompt.

    Greedy: each side generates ``tokens`` tokens on its own. Teacher-forced: both score the
    same sequence (prompt + transformers' tokens); agreement is the share of positions whose
    argmax matches, the logit difference the largest over every position and vocabulary entry.
    """

    prompt_ids: list[int]
    tokens: int
    reference_ids: list[int]
    built_ids: list[int]
    equal_prefix: int
    first_divergence: int | None
    top1_agreement: float
    max_abs_logit_diff: float
    reference_min_margin: float
    """The smallest gap between transformers' best and second-best logit along the sequence:
    when it is well above ``max_abs_logit_diff``, equal greedy output is no accident of ties."""


class EmbedAccuracy(msgspec.Struct, frozen=True, kw_only=True, tag="embeddings"):
    """An embeddings build against sentence-transformers: cosine per fixed input."""

    inputs: list[str]
    cosines: list[float]
    min_cosine: float


class ScoreAccuracy(msgspec.Struct, frozen=True, kw_only=True, tag="score"):
    """A cross-encoder build against sentence-transformers' ``CrossEncoder``: the score of
    each fixed pair by both."""

    pairs: list[list[str]]
    reference: list[float]
    built: list[float]
    max_abs_diff: float


class ClassAccuracy(msgspec.Struct, frozen=True, kw_only=True, tag="classify"):
    """A classifier build against transformers' text-classification pipeline: each fixed
    input's probabilities by both, and how often their most probable labels agree."""

    inputs: list[str]
    reference: list[list[float]]
    built: list[list[float]]
    max_abs_diff: float
    top1_agreement: float


class AccuracySkipped(msgspec.Struct, frozen=True, kw_only=True, tag="skipped"):
    """No comparison was possible (a prebuilt folder, a CUDA graph on a machine without GPU)."""

    reason: str


AccuracyReport = GenerateAccuracy | EmbedAccuracy | ScoreAccuracy | ClassAccuracy | AccuracySkipped
