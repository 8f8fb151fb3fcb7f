"""CPU work on a request's text: on the event loop while small, in a worker thread when large.

``bench/loop_stalls.py`` measures it: tokenizing a 4 MiB embeddings body held the loop for
seconds, an 8192-token chat prompt for tens of milliseconds; a one-sentence request takes
microseconds, less than the ~50 us a thread hop costs, so the hot path stays on the loop. A
thread only frees the loop for work that releases the GIL (the ``tokenizers`` batch calls) or is
pure Python (Jinja, preempted every ``sys.getswitchinterval()``); msgspec and numpy hold it.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, TypeVar

import anyio.to_thread

if TYPE_CHECKING:
    from collections.abc import Callable

T = TypeVar("T")

INLINE_CHARS = 8 << 10
"""Text up to this many characters is tokenized on the loop (a few ms at most, measured)."""


async def off_loop(chars: int, fn: Callable[..., T], *args: object) -> T:
    """``fn(*args)``, in a thread when it works on more than ``INLINE_CHARS`` characters."""
    if chars <= INLINE_CHARS:
        return fn(*args)
    return await anyio.to_thread.run_sync(partial(fn, *args))
