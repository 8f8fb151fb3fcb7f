"""The prefix cache: KV blocks of prompt prefixes kept after a prefill, reused by later prompts.

A block is ``block`` prompt positions (the prefill chunk) of every layer's keys and values. Its key
is a hash chain: block ``i``'s key hashes block ``i - 1``'s key, the scope, the adapter and the
block's token ids, so a key names the whole prefix up to the block's end (the KV of a position
depends on every token before it). The scope is the tenant's id, or ``PUBLIC`` for blocks that lie
inside the request's public prefix (a system prompt anyone may share): one tenant's blocks are
never found by another's keys. Blocks are kept in LRU order under a byte bound.

No ONNX Runtime here: a block's payload is whatever the runner stored, with its size in bytes.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from kiln_runtimes.backends.base import PrefixStats

if TYPE_CHECKING:
    from collections.abc import Sequence

    import numpy.typing as npt

    Block = tuple[npt.NDArray[Any], ...]
    """One block: its positions of every KV buffer, in ``ModelSpec.kv_names`` order (of the
    attention layers), then a hybrid's recurrent states at its end."""

PUBLIC = "public"
"""The scope of blocks inside a request's public prefix (a tenant's is ``tenant:<id>``)."""

T = TypeVar("T")


def block_keys(
    token_ids: Sequence[int], block: int, *, scope: str, adapter: str = "", public: int = 0
) -> tuple[bytes, ...]:
    """The chain keys of every whole block of ``token_ids``; blocks ending at or before
    ``public`` are scoped ``PUBLIC``, the rest ``scope``."""
    keys: list[bytes] = []
    previous = b""
    for end in range(block, len(token_ids) + 1, block):
        owner = PUBLIC if end <= public else f"tenant:{scope}"
        digest = hashlib.blake2b(previous, digest_size=16)
        digest.update(f"\0{owner}\0{adapter}\0".encode())
        digest.update(",".join(map(str, token_ids[end - block : end])).encode())
        previous = digest.digest()
        keys.append(previous)
    return tuple(keys)


def usable_blocks(prompt_length: int, block: int) -> int:
    """Blocks a prompt may take from the cache: at least its last two tokens are prefilled, since
    that prefill yields the logits of the first output token, and a one-token prefill would run
    other kernels than the same tokens prefilled without the cache (see ``chunk_length``)."""
    return max(0, (prompt_length - 2) // block)


class PrefixCache(Generic[T]):
    """Blocks by chain key, least recently used first, at most ``max_bytes`` in all."""

    def __init__(self, block: int, max_bytes: int) -> None:
        if block < 1 or max_bytes < 0:
            raise ValueError("block must be positive and max_bytes not negative")
        self.block = block
        self.max_bytes = max_bytes
        self._blocks: OrderedDict[bytes, tuple[T, int]] = OrderedDict()
        self._bytes = 0
        self._hits = self._misses = self._evictions = 0

    def __contains__(self, key: bytes) -> bool:
        return key in self._blocks

    def lookup(self, keys: Sequence[bytes]) -> list[T]:
        """The payloads of the longest cached run of leading ``keys`` (each now most recently
        used); counts its blocks as hits and the rest of ``keys`` as misses."""
        found: list[T] = []
        for key in keys:
            entry = self._blocks.get(key)
            if entry is None:
                break
            self._blocks.move_to_end(key)
            found.append(entry[0])
        self._hits += len(found)
        self._misses += len(keys) - len(found)
        return found

    def put(self, key: bytes, payload: T, nbytes: int) -> None:
        """Keep a block (most recently used), evicting the least recently used over the bound;
        a block larger than the bound is not kept."""
        if key in self._blocks or nbytes > self.max_bytes:
            return
        self._blocks[key] = (payload, nbytes)
        self._bytes += nbytes
        while self._bytes > self.max_bytes:
            _, (_, size) = self._blocks.popitem(last=False)
            self._bytes -= size
            self._evictions += 1

    def stats(self) -> PrefixStats:
        return PrefixStats(
            hit_blocks=self._hits,
            miss_blocks=self._misses,
            evicted_blocks=self._evictions,
            blocks=len(self._blocks),
            bytes=self._bytes,
            max_bytes=self.max_bytes,
            block_tokens=self.block,
        )
