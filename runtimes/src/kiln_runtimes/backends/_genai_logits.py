"""Logit processing before a draw (OpenAI and vLLM penalties, logit bias) and log-probabilities.

Pure numpy over one row of logits. The order follows vLLM's sampler: penalties and bias on the
raw logits, then temperature, then ``min_p``, ``top_k`` and ``top_p`` (``_genai_sampling``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from kiln_runtimes.protocol import MAX_LOGPROBS, ThinkBudget, TokenLogprobs

if TYPE_CHECKING:
    from collections.abc import Mapping

    from kiln_runtimes.protocol import GenerateRequest


@dataclass(frozen=True, slots=True)
class Shaping:
    """What a request asks beyond temperature and top-p (everything off by default)."""

    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    logprobs: int | None = None
    min_tokens: int = 0
    held: frozenset[int] = frozenset()
    """The tokens that would end the sequence: not drawn before ``min_tokens`` are."""
    think: ThinkBudget | None = None

    @classmethod
    def of(cls, request: GenerateRequest, ends: frozenset[int] = frozenset()) -> Shaping:
        """The request's shaping; ``ends``: the tokens that end its sequence."""
        return cls(
            top_k=request.top_k, min_p=request.min_p,
            presence_penalty=request.presence_penalty,
            frequency_penalty=request.frequency_penalty,
            repetition_penalty=request.repetition_penalty,
            logit_bias=request.logit_bias, logprobs=request.logprobs,
            min_tokens=request.min_tokens, held=ends if request.min_tokens else frozenset(),
            think=request.think_budget,
        )  # fmt: skip

    def validate(self) -> None:
        """Raise ``ValueError`` for values no sampler can use."""
        if self.top_k < 0 or not 0 <= self.min_p <= 1 or self.repetition_penalty <= 0:
            raise ValueError("top_k must be >= 0, min_p in [0, 1], repetition_penalty > 0")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise ValueError(f"logprobs must be in [0, {MAX_LOGPROBS}]")
        if self.min_tokens < 0:
            raise ValueError("min_tokens must not be negative")

    @property
    def counts_output(self) -> bool:
        """Whether the penalties need the tokens generated so far."""
        return bool(self.presence_penalty or self.frequency_penalty) or self.repeats

    @property
    def repeats(self) -> bool:
        return self.repetition_penalty != 1.0

    @property
    def processes(self) -> bool:
        """Whether the logits change before the draw."""
        held = bool(self.min_tokens and self.held)
        return self.counts_output or bool(self.logit_bias) or held or self.think is not None


class Processor:
    """Applies a request's penalties and bias to each step's logits (a copy)."""

    def __init__(self, shaping: Shaping, prompt_ids: list[int] | tuple[int, ...]) -> None:
        self.shaping = shaping
        self.counts: dict[int, int] = {}
        self.seen: set[int] = set(prompt_ids) if shaping.repeats else set()
        bias = shaping.logit_bias
        self._bias_ids = np.fromiter(bias.keys(), np.intp, len(bias))
        self._bias = np.fromiter(bias.values(), np.float32, len(bias))
        self._held = np.fromiter(shaping.held, np.intp, len(shaping.held))
        self.made = 0
        think = shaping.think
        self.thinking = self.opened = think is not None and think.inside
        """Inside the reasoning now (a budget's); whether it was ever opened."""
        self.thought = 0
        """Tokens written inside it."""
        self.last = -1
        self.forced: tuple[int, ...] = ()
        """Tokens still to be drawn, in order, after a spent budget's close."""

    def record(self, token: int) -> None:
        """Count a generated token."""
        self.made += 1
        self.counts[token] = self.counts.get(token, 0) + 1
        if self.shaping.repeats:
            self.seen.add(token)
        think, last, self.last = self.shaping.think, self.last, token
        if think is None:
            return
        if self.forced:
            self.forced = self.forced[1:]
        elif self.thinking:
            self.thinking = token != think.close
            self.thought += self.thinking
            if not self.thinking and self.thought >= think.tokens:  # the budget closed it
                self.forced = think.then
        elif token == think.open and not self.opened and think.after in (-1, last):
            self.thinking = self.opened = True  # opened (once) by the model

    def apply(self, logits: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        s, out = self.shaping, logits.astype(np.float32, copy=True)
        if s.repeats and self.seen:
            ids = np.fromiter(self.seen, np.intp, len(self.seen))
            values = out[ids]
            rp = np.float32(s.repetition_penalty)
            out[ids] = np.where(values > 0, values / rp, values * rp)
        if self.counts and (s.presence_penalty or s.frequency_penalty):
            ids = np.fromiter(self.counts.keys(), np.intp, len(self.counts))
            times = np.fromiter(self.counts.values(), np.float32, len(self.counts))
            out[ids] -= times * np.float32(s.frequency_penalty) + np.float32(s.presence_penalty)
        if self._bias_ids.size:
            out[self._bias_ids] += self._bias
        if self.made < s.min_tokens and self._held.size:
            out[self._held] = -np.inf
        if self.thinking and s.think is not None and self.thought >= s.think.tokens:
            out.fill(-np.inf)  # the budget is spent: the reasoning closes
            out[s.think.close] = 0.0
        elif self.forced:
            out.fill(-np.inf)
            out[self.forced[0]] = 0.0
        return out


BLOCK = 64
"""Entries per block of the bound ``largest`` starts from."""
NEAR_MOST = 4096
"""Entries at or above that bound past which ``largest`` partitions the whole row instead."""


def largest(values: npt.NDArray[Any], k: int) -> npt.NDArray[np.intp]:
    """The ids of the ``k`` largest entries, in no order (ties broken arbitrarily): what
    ``np.argpartition(-values, k - 1)[:k]`` gives, ~5x quicker on a vocabulary-sized row. The
    ``k``-th largest of the row's block maxima (``k`` distinct entries) is at most its ``k``-th
    largest entry, so the few entries at or above it hold the answer."""
    size = values.size
    if k >= size:
        return np.arange(size)
    blocks = size // BLOCK
    if blocks >= k:
        maxima = values[: blocks * BLOCK].reshape(blocks, BLOCK).max(axis=1)
        near = np.flatnonzero(values >= np.partition(maxima, blocks - k)[blocks - k])
        if near.size <= NEAR_MOST:
            return near[np.argpartition(-values[near], k - 1)[:k]]
    return np.argpartition(-values, k - 1)[:k]


def log_normalizer(logits: npt.NDArray[np.float32]) -> float:
    """``log(sum(exp(logits)))``, stable: ``log_softmax(x) = x - log_normalizer(x)``."""
    top = float(logits.max())
    return top + float(np.log(np.exp(logits - np.float32(top)).sum(dtype=np.float64)))


def token_logprobs(
    logits: npt.NDArray[np.float32], token: int, top: int, *, rank: bool = False
) -> TokenLogprobs:
    """The chosen token's log-probability and the ``top`` most probable, most probable first
    (only those entries are computed: ~0.1 ms on a 49k vocabulary); with ``rank``, the chosen
    token's rank too (one more pass over the row)."""
    norm = log_normalizer(logits)
    chosen = float(logits[token]) - norm
    place = int(np.count_nonzero(logits > logits[token])) + 1 if rank else 0
    if not top:
        return TokenLogprobs(logprob=chosen, rank=place)
    best = largest(logits, top)
    best = best[np.argsort(-logits[best], kind="stable")]
    return TokenLogprobs(
        logprob=chosen,
        top_ids=[int(i) for i in best],
        top_logprobs=[float(v) - norm for v in logits[best]],
        rank=place,
    )
