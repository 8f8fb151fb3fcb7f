"""Failed sign-ins, counted per email and per client address over a sliding window: past the
limit, sign-in answers 429 until the oldest failure leaves the window (checked before the
password, so a locked account cannot be probed). Per process: with N gateways an attacker gets
at most N times the limit."""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable


class Throttle:
    """At most ``limit`` failures per key in ``window_s`` seconds; ``max_keys`` keys remembered."""

    def __init__(
        self, limit: int, window_s: float, *, max_keys: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:  # fmt: skip
        self._limit, self._window, self._max_keys, self._clock = limit, window_s, max_keys, clock
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def retry_after(self, key: str) -> float | None:
        """Seconds until ``key`` may try again, or None if it may now."""
        failures = self._recent(key)
        if len(failures) < self._limit:
            return None
        return failures[0] + self._window - self._clock()

    def failed(self, key: str) -> None:
        """Count a failure of ``key``."""
        self._failures[key] = self._recent(key)
        self._failures[key].append(self._clock())
        self._failures.move_to_end(key)
        while len(self._failures) > self._max_keys:
            self._failures.popitem(last=False)

    def clear(self, key: str) -> None:
        """Forget ``key``'s failures (it signed in)."""
        self._failures.pop(key, None)

    def _recent(self, key: str) -> deque[float]:
        """``key``'s failures inside the window (a new, unstored deque for an unknown key)."""
        failures = self._failures.get(key, deque())
        horizon = self._clock() - self._window
        while failures and failures[0] <= horizon:
            failures.popleft()
        return failures


class SignInThrottle:
    """Failed sign-ins per email (``limit``) and per client address (ten times that)."""

    WINDOW_S = 900.0

    def __init__(self, limit: int) -> None:
        self._emails = Throttle(limit, self.WINDOW_S)
        self._sources = Throttle(10 * limit, self.WINDOW_S)

    def retry_after(self, email: str, source: str) -> float:
        """Seconds before this email may try again from this address (0: now)."""
        waits = (self._emails.retry_after(email.lower()), self._sources.retry_after(source))
        return max(w or 0.0 for w in waits)

    def failed(self, email: str, source: str) -> None:
        """Count a failed sign-in."""
        self._emails.failed(email.lower())
        self._sources.failed(source)

    def succeeded(self, email: str) -> None:
        """The email signed in: its failures are forgotten (the address's are not)."""
        self._emails.clear(email.lower())
