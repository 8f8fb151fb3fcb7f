"""Batch quotas, pure: a batch line's estimated tokens, the tenant-local day they are counted
in, and what a new batch or a line may take (the batches' quota code and the tests drive it).

Two limits, beside the online ones (``quotas.schemas.Limits``):

- ``batch_enqueued_tokens``: estimated tokens of the open batches (OpenAI's "enqueued token
  limit"): a new batch whose file's estimate does not fit beside them is refused;
- ``batch_tokens_per_day``: tokens (input + output) batch lines use per tenant-local day: a new
  batch whose estimate exceeds what is left today is refused, and a running batch's next line
  waits, while the day's count is spent, for the next day or a higher limit.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo

CHARS_PER_TOKEN = 4
"""Characters a token is estimated at (OpenAI's rule of thumb for English text)."""
_TEXT_KEYS = ("input", "prompt", "messages", "content", "text")


def _measure(value: Any) -> tuple[int, int]:
    """(characters of text, token ids) in a request field, nested lists and parts included."""
    if isinstance(value, str):
        return len(value), 0
    if isinstance(value, int) and not isinstance(value, bool):
        return 0, 1  # a token id (embeddings and completions take them)
    chars = ids = 0
    parts = value if isinstance(value, list) else []
    if isinstance(value, dict):
        parts = [value[k] for k in _TEXT_KEYS if k in value]
    for part in parts:
        c, i = _measure(part)
        chars, ids = chars + c, ids + i
    return chars, ids


TEXTS = ("input", "prompt", "messages", "system")
"""A line body's fields of text (``system``: an Anthropic message's)."""


def line_tokens(body: dict[str, Any]) -> int:
    """A batch line's estimated tokens: its text (``TEXTS``) at
    ``CHARS_PER_TOKEN`` characters a token, its token ids, plus the output it asks for at most
    (``max_completion_tokens`` or ``max_tokens``; none set: input only, as OpenAI counts)."""
    chars, ids = _measure({k: body[k] for k in TEXTS if k in body})
    most = body.get("max_completion_tokens", body.get("max_tokens"))
    out = most if isinstance(most, int) and not isinstance(most, bool) and most > 0 else 0
    return math.ceil(chars / CHARS_PER_TOKEN) + ids + out


def day_of(timezone: str, now: datetime) -> tuple[datetime, datetime]:
    """The tenant-local day ``now`` falls in, in the IANA zone ``timezone``: when it began and
    when the next begins (both in UTC)."""
    zone = ZoneInfo(timezone)
    today = now.astimezone(zone).date()
    start = datetime.combine(today, time(), zone)
    end = datetime.combine(today + timedelta(days=1), time(), zone)
    return start.astimezone(UTC), end.astimezone(UTC)


def refusal(name: str, limit: int, used: int, wanted: int, *, today: bool) -> str | None:
    """Why a batch of ``wanted`` estimated tokens is refused under limit ``name`` (``used`` of
    ``limit`` taken: today's, or by the open batches), or None if it fits."""
    if wanted <= limit - used:
        return None
    taken = "used by batch lines today" if today else "enqueued in open batches"
    return (
        f"Batch quota reached: {name} is {limit:,} tokens{' per day' if today else ''}; "
        f"{used:,} are {taken} and this file needs an estimated {wanted:,}. "
        + ("Try again tomorrow" if today else "Try again once open batches have completed")
        + " or ask for a higher limit."
    )


def line_waits(limit: int, used: int, tokens: int) -> bool:
    """Whether a line of ``tokens`` (estimated) must wait for the next day: it would take the
    day's count past ``limit``. The day's first line always starts (it may overshoot by its
    own size, as a request does under tokens/min)."""
    return used > 0 and used + tokens > limit
