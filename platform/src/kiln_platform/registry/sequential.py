"""The canary's error-rate test: a sequential probability ratio test on which arm each failure
came from, with a false-alarm bound that holds however often it is looked at.

Requests go to the canary with share ``q``: the step's percentage when each request is drawn
anew (split by request), else the observed share ``n_c / (n_c + n_s)`` (split by tenant). If both
versions fail at the same rate, each failure is the canary's with probability ``q`` (H0). If
the canary fails ``k`` times as often (H1, ``k`` the plan's ``error_ratio``), with probability
``q1 = k q / (k q + 1 - q)``. After ``f_c`` canary and ``f_s`` stable failures the log
likelihood ratio is::

    llr = f_c ln(q1 / q) + f_s ln((1 - q1) / (1 - q))

Under H0 the ratio ``exp(llr)`` is a non-negative martingale in the number of failures with
mean 1, so by Ville's inequality ``P(sup exp(llr) >= 1 / alpha) <= alpha``: rejecting H0 (the
canary is worse) when ``llr >= ln(1 / alpha)`` raises a false alarm with probability at most
``alpha``, checked after every request or every second alike (Wald, "Sequential tests of
statistical hypotheses", Ann. Math. Statist. 16, 1945; Ville, "Étude critique de la notion de
collectif", 1939; the always-valid view: Johari et al., "Always valid inference", 2017).

The damage bound follows from the formula: with a stable that does not fail, the test rejects
at the ``ceil(ln(1 / alpha) / ln(q1 / q))``-th canary failure (``failures_to_reject``); each
stable failure lets the canary fail ``ln((1 - q) / (1 - q1)) / ln(q1 / q)`` more times.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Verdict:
    """The test's state after some requests: its statistic, threshold, and whether it rejects."""

    llr: float
    threshold: float
    share: float
    """The canary's observed share of requests (``q``)."""

    @property
    def worse(self) -> bool:
        """The canary fails more often than the stable version (H0 rejected)."""
        return self.llr >= self.threshold


def alternative(share: float, ratio: float) -> float:
    """``q1``: the chance a failure is the canary's if it fails ``ratio`` times as often."""
    return ratio * share / (ratio * share + 1 - share)


def sprt(
    canary_n: int, canary_failed: int, stable_n: int, stable_failed: int,
    *, alpha: float, ratio: float, share: float | None = None,
) -> Verdict:  # fmt: skip
    """The SPRT on a step's counts so far (``alpha``: false-alarm bound; ``ratio``: H1's ``k``;
    ``share``: the canary's known share of requests, else the observed one)."""
    threshold = math.log(1 / alpha)
    total = canary_n + stable_n
    if canary_n == 0 or stable_n == 0:  # one arm alone: the failures say nothing of the other
        return Verdict(0.0, threshold, canary_n / total if total else 0.0)
    q = canary_n / total if share is None else share
    q1 = alternative(q, ratio)
    llr = canary_failed * math.log(q1 / q) + stable_failed * math.log((1 - q1) / (1 - q))
    return Verdict(llr, threshold, q)


def failures_to_reject(share: float, *, alpha: float, ratio: float) -> int:
    """Canary failures after which the test rejects, when the stable version has none."""
    return math.ceil(math.log(1 / alpha) / math.log(alternative(share, ratio) / share))
