"""How the console shows failures: a sign-in redirect, or the message in the page's flash area.

htmx requests get the ``_flash`` partial retargeted at ``#flash`` (the page keeps what the user
typed); full-page requests get the error page. The status code is the admin API's.
"""

from __future__ import annotations

from typing import Any

import structlog
from litestar import Request, Response
from litestar.exceptions import HTTPException, PermissionDeniedException
from litestar.response import Redirect, Template

from kiln_console.auth import LoginRequired
from kiln_platform.errors import KilnError

log = structlog.get_logger("kiln.console")
AnyRequest = Request[Any, Any, Any]


def is_htmx(request: AnyRequest) -> bool:
    """The request came from htmx (it swaps a partial), not a full page load."""
    return request.headers.get("hx-request") == "true"


def _sign_in(request: AnyRequest, _: Exception) -> Response[Any]:
    if is_htmx(request):  # a full-page redirect, not a sign-in form swapped into a table
        return Response(None, status_code=204, headers={"hx-redirect": "/console/login"})
    return Redirect("/console/login", status_code=303)


def _failure(request: AnyRequest, exc: Exception) -> Response[Any]:
    param = None
    if isinstance(exc, KilnError):
        status, message, param = exc.status_code, exc.message, exc.param
    elif isinstance(exc, PermissionDeniedException):  # the CSRF check
        status, message = 403, "The form expired or came from another site; reload the page."
    elif isinstance(exc, HTTPException):
        status, message = exc.status_code, str(exc.detail)
    else:
        log.exception("console error", path=request.url.path)
        status, message = 500, "Internal server error."
    context = {"status": status, "message": message, "field": param}
    if is_htmx(request):
        headers = {"hx-retarget": "#flash", "hx-reswap": "innerHTML"}
        return Template("_flash.html.j2", context=context, status_code=status, headers=headers)
    return Template("error.html.j2", context=context, status_code=status)


HANDLERS: dict[type[Exception] | int, Any] = {LoginRequired: _sign_in, Exception: _failure}
