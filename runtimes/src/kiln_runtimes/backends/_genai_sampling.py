"""Per-sequence token sampling on CPU logits: greedy, temperature, exact nucleus (top-p), top-k,
min-p, penalties and logit bias (``_genai_logits``), with log-probabilities."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from kiln_runtimes.backends._genai_logits import Processor, Shaping, largest, token_logprobs

if TYPE_CHECKING:
    from kiln_runtimes.backends._genai_grammar import Constraint
    from kiln_runtimes.protocol import GenerateRequest, TokenLogprobs

# Candidates examined before widening the search for the nucleus (exact either way).
NUCLEUS_FIRST_GUESS = 64
NUCLEUS_GROWTH = 8
DRAW_BLOCK = 256
PLAIN = Shaping()


class Sampler:
    """Draws one token id per step; ``temperature == 0`` is greedy, a seed makes it repeatable.

    ``shaping`` adds penalties, logit bias, ``top_k``, ``min_p`` and log-probabilities; the
    log-probabilities are of the raw logits the step produced, before any of it (vLLM's default
    ``logprobs_mode="raw_logprobs"``). A ``constraint`` (structured output) masks the shaped
    logits to what its grammar allows. Without either the draw is exactly what it always was.
    """

    def __init__(
        self, temperature: float, top_p: float, seed: int | None,
        shaping: Shaping = PLAIN, prompt_ids: list[int] | tuple[int, ...] = (),
        *, constraint: Constraint | None = None,
    ) -> None:  # fmt: skip
        if temperature < 0 or not 0 < top_p <= 1:
            raise ValueError("temperature must be >= 0 and top_p in (0, 1]")
        shaping.validate()
        self.temperature = temperature
        self.top_p = top_p
        self.shaping = shaping
        self._rng = np.random.default_rng(seed)
        self._plain = (
            temperature == 0 and not shaping.processes and shaping.logprobs is None
            and constraint is None
        )  # fmt: skip
        self._processor = Processor(shaping, prompt_ids) if shaping.processes else None
        self._constraint = constraint
        self._logprobs: list[TokenLogprobs] = []

    @classmethod
    def for_request(
        cls, request: GenerateRequest, constraint: Constraint | None = None,
        ends: frozenset[int] = frozenset(),
    ) -> Sampler:  # fmt: skip
        """The sampler a ``GenerateRequest`` asks for (``ValueError`` if it cannot be), its
        grammar's ``constraint`` built by the caller; ``ends``: the tokens that end its
        sequence (held back until ``min_tokens``)."""
        shaping = Shaping.of(request, ends)  # prompt_ids are read only by a repetition penalty
        return cls(request.temperature, request.top_p, request.seed, shaping, request.prompt_ids,
                   constraint=constraint)  # fmt: skip

    def sample(self, logits: npt.NDArray[np.float32]) -> int:
        """Pick the next token id from one row of logits."""
        if self._plain:
            return int(np.argmax(logits))
        processor, constraint = self._processor, self._constraint
        shaped = logits if processor is None else processor.apply(logits)
        token = self._choose(shaped if constraint is None else constraint.apply(shaped))
        if processor is not None:
            processor.record(token)
        if constraint is not None:
            constraint.consume(token)
        if self.shaping.logprobs is not None:
            self._logprobs.append(token_logprobs(logits, token, self.shaping.logprobs))
        return token

    def take_logprobs(self, emitted: int) -> list[TokenLogprobs] | None:
        """Log-probabilities of the last ``emitted`` tokens drawn since the last call (``None``
        when not asked for); a stop token is drawn but not emitted."""
        if self.shaping.logprobs is None:
            return None
        entries, self._logprobs = self._logprobs, []
        return entries[len(entries) - emitted :] if emitted else []

    def _choose(self, logits: npt.NDArray[np.float32]) -> int:
        if self.temperature == 0:
            return int(np.argmax(logits))
        weights = unnormalized(logits, self.temperature)
        ids, shaping = None, self.shaping
        if 0 < shaping.top_k < weights.size:
            ids = largest(weights, shaping.top_k)
            weights = weights[ids]
        if shaping.min_p > 0:  # the most probable token's weight is exactly 1
            keep = np.flatnonzero(weights >= np.float32(shaping.min_p))
            ids, weights = (keep if ids is None else ids[keep]), weights[keep]
        if self.top_p < 1:
            keep = nucleus(weights, self.top_p)
            ids, weights = (keep if ids is None else ids[keep]), weights[keep]
        index = draw(weights, self._rng.random())
        return index if ids is None else int(ids[index])


def unnormalized(logits: npt.NDArray[np.float32], temperature: float) -> npt.NDArray[np.float32]:
    """``exp((logits - max) / temperature)``: softmax without the division (float32, ~0.1 ms)."""
    weights = logits * np.float32(1 / temperature)
    weights -= weights.max()
    np.exp(weights, out=weights)
    return weights


def nucleus(weights: npt.NDArray[np.float32], top_p: float) -> npt.NDArray[np.intp]:
    """Ids of the smallest most-probable set holding ``top_p`` of the mass, most probable first.

    Looks at the top ``k`` first (``largest``) and widens only when their mass falls short,
    so the common case avoids sorting the whole vocabulary but the result is exact.
    """
    size = weights.size
    target = top_p * float(weights.sum(dtype=np.float64))
    k = min(NUCLEUS_FIRST_GUESS, size)
    while True:
        top = largest(weights, k)
        order = top[np.argsort(-weights[top], kind="stable")]
        mass = np.cumsum(weights[order], dtype=np.float64)
        if mass[-1] >= target or k == size:
            count = int(np.searchsorted(mass, target)) + 1
            return order[: min(count, k)]
        k = min(k * NUCLEUS_GROWTH, size)


def draw(weights: npt.NDArray[np.floating[Any]], u: float) -> int:
    """Inverse-CDF draw from unnormalized probabilities with a uniform ``u`` in [0, 1).

    Two levels (block sums, then one block) because a running sum over a whole vocabulary is
    slow in numpy (~0.4 ms for 49k entries) while block sums are vectorized.
    """
    if weights.size <= DRAW_BLOCK:
        return _draw_flat(weights, u)
    padded = np.pad(weights, (0, -weights.size % DRAW_BLOCK))
    blocks = np.cumsum(padded.reshape(-1, DRAW_BLOCK).sum(axis=1, dtype=np.float64))
    target = u * blocks[-1]
    block = min(int(np.searchsorted(blocks, target, side="right")), blocks.size - 1)
    start = block * DRAW_BLOCK
    before = blocks[block - 1] if block else 0.0
    inner = padded[start : start + DRAW_BLOCK]
    offset = int(np.searchsorted(np.cumsum(inner, dtype=np.float64), target - before, "right"))
    return min(start + min(offset, DRAW_BLOCK - 1), weights.size - 1)


def _draw_flat(weights: npt.NDArray[np.floating[Any]], u: float) -> int:
    cumulative = np.cumsum(weights, dtype=np.float64)
    index = int(np.searchsorted(cumulative, u * cumulative[-1], side="right"))
    return min(index, weights.size - 1)
