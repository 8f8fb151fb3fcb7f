"""How the scheduler treats a request: tenant weight, priority class and deadline from headers.

- ``x-kiln-priority: interactive | batch`` (default interactive);
- ``x-kiln-timeout: <seconds>``, else the openai SDK's ``x-stainless-read-timeout``, else
  ``KILN_REQUEST_TIMEOUT_S``: the request's deadline, checked while it waits.
"""

from __future__ import annotations

import math
from typing import Any

from litestar import Request
from litestar.params import SkipValidation

from kiln_platform.context import Kiln
from kiln_platform.errors import BadRequest
from kiln_platform.gateway.dispatch import Ticket
from kiln_platform.keys.services import Principal
from kiln_platform.scheduler.schemas import Priority

_PRIORITIES = {"interactive": Priority.INTERACTIVE, "batch": Priority.BATCH}


def _timeout(request: Request[Any, Any, Any], default: float) -> float:
    for header in ("x-kiln-timeout", "x-stainless-read-timeout"):
        raw = request.headers.get(header)
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


async def provide_ticket(
    request: Request[Any, Any, Any],
    kiln: SkipValidation[Kiln],
    principal: SkipValidation[Principal],
) -> Ticket:
    """The scheduling ticket of an authenticated request."""
    raw = request.headers.get("x-kiln-priority", "interactive").lower()
    if raw not in _PRIORITIES:
        raise BadRequest(
            "Header 'x-kiln-priority' must be 'interactive' or 'batch'.", param="x-kiln-priority"
        )
    return Ticket(
        tenant=str(principal.tenant_id),
        weight=principal.weight,
        priority=_PRIORITIES[raw],
        timeout_s=_timeout(request, kiln.settings.request_timeout_s),
    )
