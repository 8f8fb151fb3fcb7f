"""Litestar dependencies that enter a request's admission after authentication.

- ``admission``: the quotas (every authenticated `/v1` and `/v2` route);
- ``scheduled``: the quotas, then the request's class and deadline (routes that reach a
  worker): ``x-kiln-priority: interactive | batch`` (default interactive); ``x-kiln-timeout:
  <seconds>``, else the openai SDK's ``x-stainless-read-timeout``, else
  ``KILN_REQUEST_TIMEOUT_S``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from litestar import Request
from litestar.params import SkipValidation

from kiln_platform.admission.services import STATE_KEY, Admission
from kiln_platform.context import Kiln
from kiln_platform.errors import BadRequest
from kiln_platform.keys.services import Principal
from kiln_platform.scheduler.schemas import Priority

_PRIORITIES = {"interactive": Priority.INTERACTIVE, "batch": Priority.BATCH}


def timeout_of(headers: Mapping[str, str], default: float) -> float:
    """The request's timeout in seconds, from its headers (``BadRequest`` if malformed)."""
    for header in ("x-kiln-timeout", "x-stainless-read-timeout"):
        raw = headers.get(header)
        if raw is None:
            continue
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        if not 0 < value < math.inf:
            raise BadRequest(
                f"Header '{header}' must be a positive number of seconds.", param=header
            )
        return value
    return default


async def provide_admission(
    request: Request[Any, Any, Any], principal: SkipValidation[Principal]
) -> Admission:
    """The request's admission (opened by ``admission_middleware``), its quotas entered."""
    admission: Admission = request.scope["state"][STATE_KEY]
    await admission.enter(principal)
    return admission


async def provide_scheduled(
    request: Request[Any, Any, Any],
    kiln: SkipValidation[Kiln],
    principal: SkipValidation[Principal],
) -> Admission:
    """The admission of a request that goes to a worker: quotas, then class and deadline."""
    admission = await provide_admission(request, principal)
    timeout_s = timeout_of(request.headers, kiln.settings.request_timeout_s)
    admission.schedule(priority_of(request.headers), timeout_s)
    return admission


def priority_of(headers: Mapping[str, str]) -> Priority:
    """The request's class, from ``x-kiln-priority`` (``BadRequest`` if unknown)."""
    raw = headers.get("x-kiln-priority", "interactive").lower()
    if raw not in _PRIORITIES:
        raise BadRequest(
            "Header 'x-kiln-priority' must be 'interactive' or 'batch'.", param="x-kiln-priority"
        )
    return _PRIORITIES[raw]
