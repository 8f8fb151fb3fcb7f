"""One signed POST, timed and judged: the transport of tenants' webhooks (``sender``) and of
the operators' alert receivers (``slo.notify``). No redirect is followed: a 3xx is a failure."""

from __future__ import annotations

import time
from dataclasses import dataclass

import aiohttp


@dataclass(frozen=True, slots=True)
class Sent:
    """One attempt's result: ``delivered`` (a 2xx), ``error`` or ``refused`` (the SSRF guard)."""

    outcome: str
    code: int | None
    duration_s: float
    error: str | None


async def post(
    http: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str], timeout_s: float
) -> Sent:
    """POST ``body`` to ``url``; what came of it (never raises for the network's failures)."""
    started = time.perf_counter()
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    try:
        async with http.post(url, data=body, headers=headers, timeout=timeout,
                             allow_redirects=False) as response:  # fmt: skip
            code = response.status
    except (aiohttp.ClientError, TimeoutError) as exc:
        error = f"{type(exc).__name__}: {exc}"[:500]
        return Sent("error", None, time.perf_counter() - started, error)
    took = time.perf_counter() - started
    if 200 <= code < 300:
        return Sent("delivered", code, took, None)
    return Sent("error", code, took, f"HTTP {code}")
