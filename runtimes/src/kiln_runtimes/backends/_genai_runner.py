"""Runs a ``StepPlan`` on the GenAI folder's ``model.onnx`` with one slot-indexed KV cache.

The KV cache of every layer is one ``[slots, kv_heads, context_length, head_size]`` buffer bound
as both past input and present output (GroupQueryAttention's shared-buffer mode), so a decode step
over rows ``0..n-1`` is a single ONNX Runtime call on a contiguous view and a prefill is a call on
one row. Sequence lengths travel in ``attention_mask``; rows never move, and neither do buffers:
each is mapped once at full size (``_kv_area``) and costs memory only where positions were written,
so a sequence never waits for the cache to grow. ``shrink`` hands the written pages back when idle.
A plan's ``restores`` copy prefix-cache blocks into a row; a prefill's ``saves`` copy the blocks
it completes out of the row into the cache. A hybrid's linear-attention layers keep recurrent
states instead of a KV cache, a row a slot too (:class:`_States`).
"""

from __future__ import annotations

import mmap
import platform
import sys
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import onnxruntime as ort

from kiln_runtimes.backends._genai_lora import MASK, AdapterSlots, patch

if TYPE_CHECKING:
    from kiln_runtimes.backends._genai_config import ModelSpec
    from kiln_runtimes.backends._genai_prefix import Block, PrefixCache
    from kiln_runtimes.backends._genai_scheduler import PrefillWork, Restore, StepPlan

SHRINK_ABOVE = 256
"""``shrink`` releases pages only after a row held more positions than this."""
_LINUX_NORESERVE = sys.platform == "linux" and platform.machine() in ("x86_64", "aarch64")
_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000 if _LINUX_NORESERVE else 0)  # 3.11 lacks it
ORT_TYPES: dict[str, Any] = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
}


class ModelRunner:
    """Owns the ONNX Runtime session and the KV buffers; not thread-safe (one engine thread)."""

    def __init__(
        self, spec: ModelSpec, max_sequences: int, threads: int = 0, spin: bool = True,
        *, adapter_slots: int = 0, adapter_rank: int = 16,
        prefix: PrefixCache[Block] | None = None,
    ) -> None:  # fmt: skip
        """``adapter_slots``: LoRA adapters held at once (0: the graph as built, no adapters);
        ``prefix``: where prefills keep the blocks their plan says to save."""
        self.prefix = prefix
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        # Spinning workers win ~25% per step on idle cores and lose badly on oversubscribed ones.
        options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        model: str | bytes = str(spec.model_path)
        self.adapters: AdapterSlots | None = None
        if adapter_slots:
            if spec.dims is None:
                raise ValueError("genai_config.json lacks the attention shapes adapters need")
            model, targets = patch(spec.model_path, spec.dims, adapter_slots * adapter_rank)
            folder = str(spec.model_path.parent)  # the weights stay in the folder's data file
            options.add_session_config_entry(
                "session.model_external_initializers_file_folder_path", folder
            )
        self._session = ort.InferenceSession(
            model, sess_options=options, providers=["CPUExecutionProvider"]
        )
        inputs = self._session.get_inputs()
        types = {i.name: ORT_TYPES[i.type] for i in inputs}
        if adapter_slots:
            self.adapters = AdapterSlots(targets, adapter_slots, adapter_rank, types[MASK])
        self.spec = spec
        self._id_type = types[spec.input_ids]
        self._mask_type = types[spec.attention_mask]
        self._kv_names = [pair for pair in spec.kv_names() if pair[0] in types]
        """Of attention layers only: a hybrid's linear-attention layers keep no KV cache."""
        self._kv_type = types[self._kv_names[0][0]]
        logits = next(o for o in self._session.get_outputs() if o.name == spec.logits)
        self._logits_type = ORT_TYPES[logits.type]
        self.pruned: bool = logits.shape[1] == 1
        """``prune_lm_head``: the graph computes the last position's logits only (it cannot
        score prompts)."""
        self.capacity = spec.context_length
        shape = (max_sequences, spec.num_kv_heads, self.capacity, spec.head_size)
        self._areas = [_kv_area(shape, self._kv_type) for _ in self._kv_names]
        self._kv = [np.frombuffer(area, self._kv_type).reshape(shape) for area in self._areas]
        self._states = _States(spec, inputs, max_sequences)
        self._decode_bindings: dict[tuple[int, int], Any] = {}
        self._written = 0  # the most positions a row has held since the last ``shrink``
        self.scored: list[tuple[PrefillWork, npt.NDArray[np.float32]]] = []
        """The last step's prefills that score their prompt, with every position's logits."""

    def execute(self, plan: StepPlan) -> dict[int, npt.NDArray[np.float32]]:
        """Run the step plan; returns last-position logits for every slot that samples this step
        (and keeps a scoring prefill's every position in ``scored``)."""
        logits: dict[int, npt.NDArray[np.float32]] = {}
        self.scored = []
        for slot, adapter in plan.adapter_loads:
            self._slots_of_adapters().load(slot, adapter)
        for restore in plan.restores:
            self._restore(restore)
        for work in plan.prefills:
            rows = self._prefill(work)
            self._save(work)
            if work.scores:
                self.scored.append((work, rows))
            if work.last:
                logits[work.slot] = rows[-1]
        if plan.decode_slots:
            rows = self._decode(plan.decode_tokens, plan.decode_lengths, plan.decode_adapters,
                                plan.decode_slots)  # fmt: skip
            logits.update((slot, rows[slot]) for slot in plan.decode_slots)
        return logits

    def _track(self, positions: int) -> None:
        """Check a row can hold ``positions`` tokens (nothing moves or is allocated)."""
        if positions > self.capacity:
            raise ValueError(f"{positions} positions exceed the context length")
        self._written = max(self._written, positions)

    def shrink(self) -> None:
        """Release cache memory; call only when no sequence holds a slot."""
        if self._written <= SHRINK_ABOVE:
            return
        for area in self._areas:  # the pages read as zeros again; buffers and bindings stay valid
            area.madvise(mmap.MADV_DONTNEED)
        self._written = 0

    def _prefill(self, work: PrefillWork) -> npt.NDArray[np.float32]:
        """The chunk's logits, ``[positions, vocab]`` (one position if the graph is pruned)."""
        end = work.start + len(work.token_ids)
        self._track(end)
        side = self._states.gather(work.slot, work.slot + 1)
        binding = self._bind_kv(work.slot, work.slot + 1, side)
        if work.start == 0:
            self._states.clear(work.slot)
        ids = np.asarray([work.token_ids], dtype=self._id_type)
        mask = np.ones((1, end), dtype=self._mask_type)
        logits: npt.NDArray[np.float32] = self._run(binding, ids, mask, [work.adapter])[0]
        self._states.stepped((work.slot,), side)
        return logits

    def _restore(self, restore: Restore) -> None:
        end, kv = 0, len(self._kv)
        for block in restore.blocks:
            start, end = end, end + block[0].shape[1]
            self._track(end)
            for buffer, part in zip(self._kv, block[:kv], strict=True):
                buffer[restore.slot, :, start:end] = part
        self._states.restore(restore.slot, restore.blocks[-1][kv:])

    def _save(self, work: PrefillWork) -> None:
        """Keep the blocks the chunk completed; a hybrid's with its states at the block's end,
        which is the chunk's (``Scheduler.aligned``)."""
        if self.prefix is None:
            return
        for start, key in work.saves:
            end = start + self.prefix.block
            block = tuple(buffer[work.slot, :, start:end].copy() for buffer in self._kv)
            block += self._states.snapshot(work.slot)
            self.prefix.put(key, block, sum(part.nbytes for part in block))

    def _decode(
        self, tokens: tuple[int, ...], lengths: tuple[int, ...], adapters: tuple[int, ...],
        slots: tuple[int, ...],
    ) -> npt.NDArray[np.float32]:  # fmt: skip
        totals = np.asarray(lengths, dtype=np.int64) + 1
        width = int(totals.max())
        self._track(width)
        side = self._states.gather(0, len(tokens))
        binding = self._decode_bindings.get((len(tokens), side))
        if binding is None:
            binding = self._bind_kv(0, len(tokens), side)
            self._decode_bindings[len(tokens), side] = binding
        ids = np.asarray(tokens, dtype=self._id_type)[:, None]
        mask = (np.arange(width)[None, :] < totals[:, None]).astype(self._mask_type)
        logits = self._run(binding, ids, mask, list(adapters or (-1,) * len(tokens)))[:, -1]
        self._states.stepped(slots, side)
        return logits

    def _run(
        self, binding: Any, ids: npt.NDArray[Any], mask: npt.NDArray[Any], adapters: list[int]
    ) -> npt.NDArray[np.float32]:
        """Bind inputs and a fresh logits buffer, run, return ``[rows, positions, vocab]``;
        ``adapters``: each row's adapter slot (``-1``: none)."""
        positions = 1 if self.pruned else ids.shape[1]
        shape = (ids.shape[0], positions, self.spec.vocab_size)
        logits = np.empty(shape, dtype=self._logits_type)
        binding.bind_cpu_input(self.spec.input_ids, ids)
        binding.bind_cpu_input(self.spec.attention_mask, mask)
        if self.adapters is not None:
            binding.bind_cpu_input(MASK, self.adapters.mask(adapters))
        _bind_array(binding.bind_output, self.spec.logits, logits)
        self._session.run_with_iobinding(binding)
        return logits.astype(np.float32, copy=False)

    def _bind_kv(self, start: int, stop: int, side: int) -> Any:
        """A binding whose past and present tensors are rows ``start:stop`` of the cache (and of
        the states, read from ``side``)."""
        binding = self._session.io_binding()
        for buffer, (past, present) in zip(self._kv, self._kv_names, strict=True):
            rows = buffer[start:stop]
            _bind_array(binding.bind_input, past, rows)
            _bind_array(binding.bind_output, present, rows)
        self._states.bind(binding, start, stop, side)
        for name, array in (self.adapters.inputs if self.adapters else {}).items():
            _bind_array(binding.bind_input, name, array)  # written in place by ``load``
        return binding

    def _slots_of_adapters(self) -> AdapterSlots:
        if self.adapters is None:
            raise RuntimeError("this model was loaded without adapter slots")
        return self.adapters


class _States:
    """The recurrent states of a hybrid's linear-attention layers (none for other decoders), one
    row a slot like the KV cache, in two buffers a state: a step reads rows of one side and
    writes the next states to the other, and a row's state is on the side it was last written
    to (``side``). A decode step over rows ``0..n-1`` reads them all from one side, so a row on
    the other is copied over first (one prefilled since, or one that did not decode): rows that
    decode together flip together and copy nothing. A decode step also runs throwaway tokens on
    rows that are not decoding; their written states are left on the side they do not read."""

    def __init__(self, spec: ModelSpec, inputs: list[Any], rows: int) -> None:
        shapes = {i.name: (i.shape, ORT_TYPES[i.type]) for i in inputs}
        self.names = [pair for pair in spec.state_names() if pair[0] in shapes]
        self.buffers = [[np.zeros((rows, *shapes[past][0][1:]), shapes[past][1])
                         for past, _ in self.names] for _ in range(2)]  # fmt: skip
        self.side = np.zeros(rows, dtype=np.intp)

    def gather(self, start: int, stop: int) -> int:
        """Bring rows ``start:stop`` to one side (the one most of them are on); return it."""
        if not self.names:
            return 0
        sides = self.side[start:stop]
        side = int(np.count_nonzero(sides) * 2 > len(sides))
        for row in np.flatnonzero(sides != side) + start:
            for there, here in zip(self.buffers[1 - side], self.buffers[side], strict=True):
                here[row] = there[row]
        sides[:] = side
        return side

    def bind(self, binding: Any, start: int, stop: int, side: int) -> None:
        pairs = zip(self.names, self.buffers[side], self.buffers[1 - side], strict=True)
        for (past, present), read, written in pairs:
            _bind_array(binding.bind_input, past, read[start:stop])
            _bind_array(binding.bind_output, present, written[start:stop])

    def clear(self, slot: int) -> None:
        """A new sequence in ``slot`` starts from zero states."""
        for state in self.buffers[self.side[slot]]:
            state[slot] = 0

    def snapshot(self, slot: int) -> tuple[npt.NDArray[Any], ...]:
        """Copies of ``slot``'s states (none for other decoders)."""
        return tuple(state[slot].copy() for state in self.buffers[self.side[slot]])

    def restore(self, slot: int, states: tuple[npt.NDArray[Any], ...]) -> None:
        """Put a snapshot back as ``slot``'s states."""
        for state, saved in zip(self.buffers[self.side[slot]], states, strict=True):
            state[slot] = saved

    def stepped(self, slots: tuple[int, ...], side: int) -> None:
        """``slots`` stepped from ``side``: their states are now on the other."""
        if self.names:
            self.side[list(slots)] = 1 - side


def _kv_area(shape: tuple[int, ...], dtype: Any) -> mmap.mmap:
    """Private anonymous memory for one KV buffer, mapped (not committed) at full size: a page
    becomes resident when a position in it is first written. Small pages: numpy's allocator
    asks for transparent huge pages, which would make 2 MB resident for one written position."""
    area = mmap.mmap(-1, int(np.prod(shape)) * np.dtype(dtype).itemsize,
                     flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _NORESERVE)  # fmt: skip
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        area.madvise(mmap.MADV_NOHUGEPAGE)
    return area


def _bind_array(bind: Any, name: str, array: npt.NDArray[Any]) -> None:
    """Bind a C-contiguous numpy array by address (no copy); ``array`` must outlive the run."""
    bind(name, "cpu", 0, array.dtype, list(array.shape), array.ctypes.data)
