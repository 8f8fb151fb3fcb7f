"""Structured outputs: a request's grammar (llguidance's JSON form, e.g. compiled from a JSON
schema by the gateway) masks each step's logits to the tokens that keep the text inside it.

llguidance computes the mask from the grammar and the tokens so far (about 0.1 ms a step for a
small JSON schema, docs/api.md); the draw then happens on the masked logits, so every sampling
setting keeps its meaning among the allowed tokens. Once the grammar is complete only the
model's stop tokens are allowed, and the sequence ends as any other does.
"""

from __future__ import annotations

import json
import threading
from typing import TYPE_CHECKING, Any

import llguidance
import numpy as np
import numpy.typing as npt
from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

from kiln_runtimes.byte_level import CHAR_OF

if TYPE_CHECKING:
    from pathlib import Path

    from kiln_runtimes.protocol import GenerateRequest


class Constraint:
    """One sequence's grammar: the mask before each draw, the drawn token after it."""

    def __init__(self, matcher: llguidance.LLMatcher, vocab_size: int, stops: list[int]) -> None:
        self._matcher = matcher
        self._vocab_size = vocab_size
        self._bits = allocate_token_bitmask(1, vocab_size)
        self._stops = np.asarray(stops, np.intp)

    def allowed(self) -> npt.NDArray[np.bool_]:
        """Which token ids may come next (only the stop tokens once the grammar is complete,
        or if the matcher failed: the sequence then ends rather than leaving the grammar)."""
        if self._matcher.is_error():
            allowed = np.zeros(self._vocab_size, np.bool_)
            allowed[self._stops] = True
            return allowed
        fill_next_token_bitmask(self._matcher, self._bits)
        bits = np.unpackbits(self._bits.view(np.uint8), bitorder="little")
        return bits[: self._vocab_size].view(np.bool_)

    def apply(self, logits: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """A copy of ``logits`` with every token the grammar forbids at ``-inf``."""
        masked: npt.NDArray[np.float32] = np.where(self.allowed(), logits, np.float32(-np.inf))
        return masked

    def consume(self, token: int) -> None:
        """Advance past a drawn token (a stop token ends the grammar's part)."""
        self._matcher.consume_token(token)


class Grammars:
    """A model's llguidance tokenizer, built on the first structured request (~0.4 s, then
    kept), and the constraint each such request gets."""

    def __init__(self, tokenizer_json: Path, vocab_size: int) -> None:
        self._path = tokenizer_json
        self._vocab_size = vocab_size
        self._tokenizers: dict[tuple[int, ...], llguidance.LLTokenizer] = {}
        self._lock = threading.Lock()

    def constraint(self, request: GenerateRequest) -> Constraint | None:
        """The request's constraint (``None`` without a grammar); ``ValueError`` if its grammar
        is not one llguidance can run."""
        if request.grammar is None:
            return None
        stops = sorted(request.stop_token_ids)
        if not stops:
            raise ValueError("a grammar needs stop_token_ids to end the sequence with")
        matcher = llguidance.LLMatcher(self._tokenizer(tuple(stops)), request.grammar)
        if matcher.is_error():
            raise ValueError(f"grammar: {matcher.get_error()}")
        return Constraint(matcher, self._vocab_size, stops)

    def _tokenizer(self, stops: tuple[int, ...]) -> llguidance.LLTokenizer:
        with self._lock:
            tokenizer = self._tokenizers.get(stops)
            if tokenizer is None:
                text = text_added_tokens(self._path.read_text(encoding="utf-8"))
                tokenizer = llguidance.LLTokenizer(
                    text, n_vocab=self._vocab_size, eos_token=list(stops)
                )
                self._tokenizers[stops] = tokenizer
            return tokenizer


def text_added_tokens(raw: str) -> str:
    """The tokenizer JSON for llguidance, each added token that is not special (Qwen's
    ``<tool_call>`` and ``<think>``) moved into the model's vocabulary as the text it stands for.

    llguidance takes every added token for a special one, bytes no text is made of: a grammar
    could not take the model's own ``<tool_call>`` token for that text, and one that forces the
    text (a regex starting ``<think>``) fails, as llguidance spells it with that token and then
    refuses it. Special tokens stay as they are."""
    spec: dict[str, Any] = json.loads(raw)
    vocab = (spec.get("model") or {}).get("vocab")
    if not isinstance(vocab, dict):  # Unigram's is a list: left as it was
        return raw
    byte_level = "ByteLevel" in json.dumps([spec.get("pre_tokenizer"), spec.get("decoder")])
    kept = []
    for token in spec.get("added_tokens") or []:
        content = str(token.get("content", ""))
        written = (
            "".join(CHAR_OF[b] for b in content.encode()) if byte_level
            else content.replace(" ", "\u2581")
        )  # fmt: skip
        if token.get("special") or not content or written in vocab:
            kept.append(token)
        else:
            vocab[written] = token["id"]
    spec["added_tokens"] = kept
    return json.dumps(spec)
