"""Continuous-batching scheduler over KV-cache slots: admission, chunked prefill, stop rules.

Pure Python, no ONNX Runtime: the engine loop asks ``schedule()`` for a ``Batch`` (plain data),
runs it, samples one token per ready slot and hands the tokens back to ``update()``.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kiln_runtimes._attribution import shares_by

if TYPE_CHECKING:
    from collections.abc import Mapping

    from kiln_runtimes.protocol import FinishReason


@dataclass(eq=False, kw_only=True)
class Sequence:
    """One request's generation state; ``slot`` is its row in the KV cache once admitted."""

    seq_id: int
    prompt_ids: list[int]
    max_tokens: int
    stop_ids: frozenset[int]
    slot: int | None = None
    prefilled: int = 0
    output_ids: list[int] = field(default_factory=list)
    created_at: float = field(default_factory=time.monotonic)
    queue_s: float = 0.0
    """How long it waited for a slot."""
    compute_s: float = 0.0
    """Its share of the steps it took part in (``Scheduler.charge``)."""
    express: bool = False
    """Admitted ahead of waiting normal sequences (the gateway's express lane)."""

    @property
    def prefill_done(self) -> bool:
        return self.prefilled >= len(self.prompt_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)


@dataclass(frozen=True)
class PrefillWork:
    """Prompt tokens ``[start, start + len(token_ids))`` of the sequence in ``slot``."""

    slot: int
    start: int
    token_ids: tuple[int, ...]
    last: bool


@dataclass(frozen=True)
class Batch:
    """One step's work. Decode covers rows ``0..len(decode_tokens)-1``; only ``decode_slots`` count.

    ``decode_lengths`` is how many KV positions each row already holds (the new token is written
    there); rows that are not decoding get a throwaway token at a position overwritten later.
    """

    prefills: tuple[PrefillWork, ...] = ()
    decode_slots: tuple[int, ...] = ()
    decode_tokens: tuple[int, ...] = ()
    decode_lengths: tuple[int, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.prefills and not self.decode_slots


@dataclass(frozen=True)
class SequenceOutput:
    """New token ids of one sequence after a step; ``finish_reason`` set on its last output."""

    seq_id: int
    token_ids: tuple[int, ...]
    finish_reason: FinishReason | None
    prompt_tokens: int
    completion_tokens: int
    queue_s: float = 0.0
    compute_s: float = 0.0


def finish_reason(seq: Sequence, token: int, context_length: int) -> FinishReason | None:
    """Why ``seq`` ends after emitting ``token`` (already appended), or ``None`` to go on."""
    if token in seq.stop_ids:
        return "stop"
    if len(seq.output_ids) >= seq.max_tokens or seq.num_tokens >= context_length:
        return "length"
    return None


def output(
    seq: Sequence, token_ids: tuple[int, ...], reason: FinishReason | None
) -> SequenceOutput:
    """What the stream of ``seq`` receives; stop tokens are counted but not emitted."""
    return SequenceOutput(
        seq_id=seq.seq_id,
        token_ids=token_ids,
        finish_reason=reason,
        prompt_tokens=len(seq.prompt_ids),
        completion_tokens=len(seq.output_ids),
        queue_s=seq.queue_s,
        compute_s=seq.compute_s,
    )


def step_tokens(batch: Batch) -> dict[int, int]:
    """Tokens each slot processes in a step: its prompt chunk, or the one token it decodes."""
    tokens = {slot: 1 for slot in batch.decode_slots}
    for work in batch.prefills:
        tokens[work.slot] = tokens.get(work.slot, 0) + len(work.token_ids)
    return tokens


class Scheduler:
    """FIFO admission into free slots (express sequences first); a per-step prompt-token budget
    bounds prefill stalls."""

    def __init__(
        self, max_sequences: int, prefill_chunk: int, context_length: int, pad_token_id: int
    ) -> None:
        if max_sequences < 1 or prefill_chunk < 1:
            raise ValueError("max_sequences and prefill_chunk must be positive")
        self.slots: list[Sequence | None] = [None] * max_sequences
        self.waiting: deque[Sequence] = deque()
        self.prefill_chunk = prefill_chunk
        self.context_length = context_length
        self.pad_token_id = pad_token_id

    @property
    def running(self) -> int:
        return sum(seq is not None for seq in self.slots)

    def has_work(self) -> bool:
        return bool(self.waiting) or self.running > 0

    def add(self, seq: Sequence) -> None:
        """Queue a sequence; it is admitted by a later ``schedule()``. An express one waits
        ahead of every normal one, behind earlier express ones."""
        if len(seq.prompt_ids) + seq.max_tokens > self.context_length:
            raise ValueError("prompt plus max_tokens exceeds the context length")
        if not seq.express:
            self.waiting.append(seq)
            return
        ahead = next((i for i, w in enumerate(self.waiting) if not w.express), len(self.waiting))
        self.waiting.insert(ahead, seq)

    def abort(self, seq_id: int) -> SequenceOutput | None:
        """Drop a waiting or running sequence; returns its final (cancelled) output."""
        for queued in self.waiting:
            if queued.seq_id == seq_id:
                self.waiting.remove(queued)
                return output(queued, (), "cancelled")
        for running in self.slots:
            if running is not None and running.seq_id == seq_id:
                self._free(running)
                return output(running, (), "cancelled")
        return None

    def schedule(self) -> Batch:
        """Admit waiting sequences into free slots, then plan prefill chunks and one decode."""
        self._admit()
        prefills = self._plan_prefills()
        return self._plan_decode(prefills)

    def charge(self, batch: Batch, seconds: float) -> None:
        """Share a step's time among its sequences, in proportion to the tokens each processed
        (the padding rows of a decode are nobody's)."""
        for slot, share in shares_by(step_tokens(batch), seconds).items():
            self._occupant(slot).compute_s += share

    def update(self, batch: Batch, sampled: Mapping[int, int]) -> list[SequenceOutput]:
        """Record the executed batch and one sampled token per ready slot; free finished slots."""
        for work in batch.prefills:
            self._occupant(work.slot).prefilled = work.start + len(work.token_ids)
        outputs = []
        for slot, token in sampled.items():
            seq = self._occupant(slot)
            seq.output_ids.append(token)
            reason = finish_reason(seq, token, self.context_length)
            if reason is not None:
                self._free(seq)
            outputs.append(output(seq, () if reason == "stop" else (token,), reason))
        return outputs

    def _admit(self) -> None:
        while self.waiting and None in self.slots:
            seq = self.waiting.popleft()
            seq.queue_s = time.monotonic() - seq.created_at
            seq.slot = self.slots.index(None)
            self.slots[seq.slot] = seq

    def _plan_prefills(self) -> tuple[PrefillWork, ...]:
        budget, works = self.prefill_chunk, []
        pending = sorted((s for s in self.slots if s and not s.prefill_done), key=_seq_id)
        for seq in pending:
            if budget == 0:
                break
            end = min(len(seq.prompt_ids), seq.prefilled + budget)
            chunk = tuple(seq.prompt_ids[seq.prefilled : end])
            works.append(PrefillWork(_slot(seq), seq.prefilled, chunk, end == len(seq.prompt_ids)))
            budget -= len(chunk)
        return tuple(works)

    def _plan_decode(self, prefills: tuple[PrefillWork, ...]) -> Batch:
        ready = [s for s in self.slots if s is not None and s.prefill_done and s.output_ids]
        if not ready:
            return Batch(prefills=prefills)
        rows = max(_slot(s) for s in ready) + 1
        tokens, lengths = [self.pad_token_id] * rows, [0] * rows
        for slot, seq in enumerate(self.slots[:rows]):
            if seq is not None:
                lengths[slot] = seq.prefilled
        for work in prefills:
            if work.slot < rows:
                lengths[work.slot] = work.start + len(work.token_ids)
        for seq in ready:
            tokens[_slot(seq)], lengths[_slot(seq)] = seq.output_ids[-1], seq.num_tokens - 1
        return Batch(prefills, tuple(_slot(s) for s in ready), tuple(tokens), tuple(lengths))

    def _occupant(self, slot: int) -> Sequence:
        seq = self.slots[slot]
        if seq is None:
            raise RuntimeError(f"slot {slot} is empty")
        return seq

    def _free(self, seq: Sequence) -> None:
        self.slots[_slot(seq)] = None
        seq.slot = None


def _seq_id(seq: Sequence) -> int:
    return seq.seq_id


def _slot(seq: Sequence) -> int:
    if seq.slot is None:
        raise RuntimeError(f"sequence {seq.seq_id} holds no slot")
    return seq.slot
