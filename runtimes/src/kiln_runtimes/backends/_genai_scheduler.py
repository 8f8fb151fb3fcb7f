"""Continuous-batching scheduler over KV-cache slots: admission, chunked prefill, stop rules.

Pure Python, no ONNX Runtime: the engine loop asks ``schedule()`` for a ``StepPlan`` (plain data),
runs it, samples one token per ready slot and hands the tokens back to ``update()``.

The prompt tokens of one step are bounded by a budget: ``prefill_chunk`` while nothing decodes
(a new prompt's first token comes soonest), ``decoding_budget`` while some sequence decodes (each
running stream's next token waits for the step, so a small budget keeps its gaps even). Chunks
end wherever the budget does, but none is a single token of a longer prompt: on ONNX Runtime's
CPU kernels the KV a prompt leaves is bit for bit the same however it was cut into chunks of two
tokens or more (``tests/integration/genai/test_genai_kv.py``), so a block restored from the
prefix cache holds what prefilling it would have written.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from kiln_runtimes._attribution import shares_by
from kiln_runtimes.backends._genai_prefix import block_keys, usable_blocks
from kiln_runtimes.lora import SlotTable

if TYPE_CHECKING:
    from collections.abc import Mapping

    from kiln_runtimes.backends._genai_prefix import Block, PrefixCache
    from kiln_runtimes.lora import Adapter
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
    adapter: Adapter | None = None
    adapter_key: str = ""
    """Which adapter (its artifact digest); ``adapter_slot`` is where it is loaded."""
    adapter_slot: int = -1
    tenant: str = ""
    public_prefix: int = 0
    """Leading prompt tokens any tenant may share in the prefix cache."""
    prefix_keys: tuple[bytes, ...] = ()
    """Prefix-cache keys of its prompt's whole blocks (``Scheduler.add``)."""
    cached_tokens: int = 0
    """Prompt tokens restored from the prefix cache instead of prefilled."""
    prompt_logprobs: int | None = None
    """Its prompt is scored with this many alternatives per token: prefilled whole (nothing
    restored from the prefix cache), every position's logits kept."""

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
    adapter: int = -1
    """The sequence's adapter slot (``-1``: the base model)."""
    saves: tuple[tuple[int, bytes], ...] = ()
    """Blocks this chunk completes to keep in the prefix cache: (first position, key)."""
    scores: bool = False
    """Keep every position's logits (the sequence scores its prompt)."""


@dataclass(frozen=True)
class Restore:
    """Prefix-cache blocks to copy into ``slot``'s row, from position 0 on."""

    slot: int
    blocks: tuple[Block, ...]


@dataclass(frozen=True)
class StepPlan:
    """One step's work. Decode covers rows ``0..len(decode_tokens)-1``; only ``decode_slots`` count.

    ``decode_lengths`` is how many KV positions each row already holds (the new token is written
    there); rows that are not decoding get a throwaway token at a position overwritten later.
    ``adapter_loads`` are written into their adapter slots and ``restores`` into their rows
    before the step runs.
    """

    prefills: tuple[PrefillWork, ...] = ()
    decode_slots: tuple[int, ...] = ()
    decode_tokens: tuple[int, ...] = ()
    decode_lengths: tuple[int, ...] = ()
    decode_adapters: tuple[int, ...] = ()
    adapter_loads: tuple[tuple[int, Adapter], ...] = ()
    restores: tuple[Restore, ...] = ()

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
    cached_tokens: int = 0
    queue_s: float = 0.0
    compute_s: float = 0.0
    stop_token: int | None = None
    """The stop token that ended the sequence (counted, not emitted)."""


def finish_reason(seq: Sequence, token: int, context_length: int) -> FinishReason | None:
    """Why ``seq`` ends after emitting ``token`` (already appended), or ``None`` to go on."""
    if token in seq.stop_ids:
        return "stop"
    if len(seq.output_ids) >= seq.max_tokens or seq.num_tokens >= context_length:
        return "length"
    return None


def output(
    seq: Sequence, token_ids: tuple[int, ...], reason: FinishReason | None,
    stop_token: int | None = None,
) -> SequenceOutput:  # fmt: skip
    """What the stream of ``seq`` receives; stop tokens are counted but not emitted (the one
    that ended it is named)."""
    return SequenceOutput(
        seq_id=seq.seq_id,
        token_ids=token_ids,
        finish_reason=reason,
        prompt_tokens=len(seq.prompt_ids),
        completion_tokens=len(seq.output_ids),
        cached_tokens=seq.cached_tokens,
        queue_s=seq.queue_s,
        compute_s=seq.compute_s,
        stop_token=stop_token,
    )


def step_tokens(plan: StepPlan) -> dict[int, int]:
    """Tokens each slot processes in a step: its prompt chunk, or the one token it decodes."""
    tokens = {slot: 1 for slot in plan.decode_slots}
    for work in plan.prefills:
        tokens[work.slot] = tokens.get(work.slot, 0) + len(work.token_ids)
    return tokens


def chunk_length(rest: int, budget: int) -> int:
    """Prompt tokens to prefill now out of ``rest``: never one token of a longer rest nor all but
    one, since a one-token chunk runs other kernels and writes slightly different KV. At most
    ``budget``, or one more when that takes a rest of two or three tokens whole; 0 (wait for
    the next step) when a budget of 1 is left. A budget of 2 or more always makes progress."""
    if rest <= budget:
        return rest
    if rest == budget + 1:
        return budget - 1 if budget >= 3 else rest
    return budget if budget >= 2 else 0


class Scheduler:
    """FIFO admission into free slots (express sequences first); a per-step prompt-token budget
    bounds prefill stalls. A sequence whose adapter finds no adapter slot (all pinned by running
    sequences of other adapters) waits while later ones go ahead."""

    def __init__(
        self, max_sequences: int, prefill_chunk: int, context_length: int, pad_token_id: int,
        adapter_slots: int = 0, *, prefix: PrefixCache[Block] | None = None,
        decoding_budget: int | None = None, aligned: bool = False,
    ) -> None:  # fmt: skip
        """``prefix``: the prefix cache, its blocks ``prefill_chunk`` tokens long;
        ``decoding_budget``: prompt tokens per step while a sequence decodes (default
        ``prefill_chunk``); ``aligned``: a block is saved only where a chunk ends (a hybrid's
        recurrent state is known there only), so chunks end at blocks to save."""
        decoding_budget = prefill_chunk if decoding_budget is None else decoding_budget
        if max_sequences < 1 or prefill_chunk < 2 or decoding_budget < 2:
            raise ValueError(
                "max_sequences must be positive, prefill_chunk and decoding_budget at least 2"
            )
        if prefix is not None and prefix.block != prefill_chunk:
            raise ValueError("prefix cache blocks must be prefill_chunk tokens long")
        self.prefix = prefix
        self.aligned = aligned
        self.adapters = SlotTable(adapter_slots) if adapter_slots else None
        self.slots: list[Sequence | None] = [None] * max_sequences
        self.waiting: deque[Sequence] = deque()
        self.prefill_chunk = prefill_chunk
        self.decoding_budget = min(decoding_budget, prefill_chunk)
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
        if seq.adapter is not None and self.adapters is None:
            raise ValueError("this worker has no adapter slots")
        if self.prefix is not None:
            seq.prefix_keys = block_keys(
                seq.prompt_ids, self.prefix.block, scope=seq.tenant, adapter=seq.adapter_key,
                public=seq.public_prefix,
            )  # fmt: skip
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

    def schedule(self) -> StepPlan:
        """Admit waiting sequences into free slots, then plan prefill chunks and one decode."""
        loads, restores = self._admit()
        prefills = self._plan_prefills()
        return replace(self._plan_decode(prefills), adapter_loads=loads, restores=restores)

    def charge(self, plan: StepPlan, seconds: float) -> None:
        """Share a step's time among its sequences, in proportion to the tokens each processed
        (the padding rows of a decode are nobody's)."""
        for slot, share in shares_by(step_tokens(plan), seconds).items():
            self._occupant(slot).compute_s += share

    def update(self, plan: StepPlan, sampled: Mapping[int, int]) -> list[SequenceOutput]:
        """Record the executed step and one sampled token per ready slot; free finished slots."""
        for work in plan.prefills:
            self._occupant(work.slot).prefilled = work.start + len(work.token_ids)
        outputs = []
        for slot, token in sampled.items():
            seq = self._occupant(slot)
            seq.output_ids.append(token)
            reason = finish_reason(seq, token, self.context_length)
            if reason is not None:
                self._free(seq)
            stopped = reason == "stop"
            outputs.append(output(seq, () if stopped else (token,), reason,
                                  token if stopped else None))  # fmt: skip
        return outputs

    def _admit(self) -> tuple[tuple[tuple[int, Adapter], ...], tuple[Restore, ...]]:
        loads: list[tuple[int, Adapter]] = []
        restores: list[Restore] = []
        for seq in list(self.waiting):
            if None not in self.slots:
                break
            if seq.adapter is not None and not self._place_adapter(seq, loads):
                continue
            self.waiting.remove(seq)
            seq.queue_s = time.monotonic() - seq.created_at
            seq.slot = self.slots.index(None)
            self.slots[seq.slot] = seq
            restores.extend(self._restore(seq))
        return tuple(loads), tuple(restores)

    def _restore(self, seq: Sequence) -> tuple[Restore, ...]:
        """Start ``seq`` past the blocks of its prompt the prefix cache holds."""
        if self.prefix is None or seq.prompt_logprobs is not None:
            return ()
        usable = seq.prefix_keys[: usable_blocks(len(seq.prompt_ids), self.prefix.block)]
        blocks = self.prefix.lookup(usable)
        seq.prefilled = seq.cached_tokens = len(blocks) * self.prefix.block
        return (Restore(_slot(seq), tuple(blocks)),) if blocks else ()

    def _place_adapter(self, seq: Sequence, loads: list[tuple[int, Adapter]]) -> bool:
        placed = self.adapters.acquire(seq.adapter_key) if self.adapters else None
        if placed is None or seq.adapter is None:
            return False
        seq.adapter_slot, must_load = placed
        if must_load:
            loads.append((seq.adapter_slot, seq.adapter))
        return True

    def _plan_prefills(self) -> tuple[PrefillWork, ...]:
        decoding = any(s is not None and s.output_ids for s in self.slots)
        budget = self.decoding_budget if decoding else self.prefill_chunk
        works: list[PrefillWork] = []
        pending = sorted((s for s in self.slots if s and not s.prefill_done), key=_seq_id)
        for seq in pending:
            if budget < 1:
                break
            end = self._block_end(
                seq, seq.prefilled + chunk_length(len(seq.prompt_ids) - seq.prefilled, budget)
            )
            if end == seq.prefilled:
                continue
            chunk = tuple(seq.prompt_ids[seq.prefilled : end])
            last = end == len(seq.prompt_ids)
            saves = self._saves(seq, end)
            works.append(PrefillWork(_slot(seq), seq.prefilled, chunk, last, seq.adapter_slot,
                                     saves, seq.prompt_logprobs is not None))  # fmt: skip
            budget -= len(chunk)
        return tuple(works)

    def _saves(self, seq: Sequence, end: int) -> tuple[tuple[int, bytes], ...]:
        """The blocks a chunk of ``seq`` ending at ``end`` completes that the cache lacks."""
        if self.prefix is None:
            return ()
        size, keys = self.prefix.block, seq.prefix_keys
        done = range(seq.prefilled // size, min(end // size, len(keys)))
        return tuple((i * size, keys[i]) for i in done if keys[i] not in self.prefix
                     and (not self.aligned or (i + 1) * size == end))  # fmt: skip

    def _block_end(self, seq: Sequence, end: int) -> int:
        """``aligned``: a chunk that would pass the end of a block the cache lacks ends there
        (unless that would leave a one-token chunk, whose kernels differ: the block is not
        saved then)."""
        if not self.aligned or self.prefix is None:
            return end
        size, keys = self.prefix.block, seq.prefix_keys
        block = seq.prefilled // size  # the block the chunk starts in
        boundary = (block + 1) * size
        if boundary >= end or block >= len(keys) or keys[block] in self.prefix:
            return end
        take, rest = boundary - seq.prefilled, len(seq.prompt_ids) - seq.prefilled
        return boundary if take >= 2 and rest - take != 1 else end

    def _plan_decode(self, prefills: tuple[PrefillWork, ...]) -> StepPlan:
        ready = [s for s in self.slots if s is not None and s.prefill_done and s.output_ids]
        if not ready:
            return StepPlan(prefills=prefills)
        rows = max(_slot(s) for s in ready) + 1
        tokens, lengths = [self.pad_token_id] * rows, [0] * rows
        adapters = [-1] * rows
        for slot, seq in enumerate(self.slots[:rows]):
            if seq is not None:
                lengths[slot] = seq.prefilled
                adapters[slot] = seq.adapter_slot
        for work in prefills:
            if work.slot < rows:
                lengths[work.slot] = work.start + len(work.token_ids)
        for seq in ready:
            tokens[_slot(seq)], lengths[_slot(seq)] = seq.output_ids[-1], seq.num_tokens - 1
        decode = tuple(_slot(s) for s in ready)
        return StepPlan(prefills, decode, tuple(tokens), tuple(lengths), tuple(adapters))

    def _occupant(self, slot: int) -> Sequence:
        seq = self.slots[slot]
        if seq is None:
            raise RuntimeError(f"slot {slot} is empty")
        return seq

    def _free(self, seq: Sequence) -> None:
        self.slots[_slot(seq)] = None
        seq.slot = None
        if seq.adapter_slot >= 0 and self.adapters is not None:
            self.adapters.release(seq.adapter_key)
            seq.adapter_slot = -1


def _seq_id(seq: Sequence) -> int:
    return seq.seq_id


def _slot(seq: Sequence) -> int:
    if seq.slot is None:
        raise RuntimeError(f"sequence {seq.seq_id} holds no slot")
    return seq.slot
