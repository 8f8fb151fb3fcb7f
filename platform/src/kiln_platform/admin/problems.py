"""The error responses of ``/admin/v1`` in its OpenAPI document.

``app._error_response`` answers every error outside ``/v1`` and ``/v2`` as RFC 9457 problem
details (``application/problem+json``); Litestar documents its own 400 as ``application/json``.
Admin controllers derive from ``DocumentedController`` so the document says what is sent
(schemathesis checks responses against it).
"""

from __future__ import annotations

import msgspec
from litestar import Controller
from litestar.handlers import BaseRouteHandler, HTTPRouteHandler
from litestar.openapi import ResponseSpec

PROBLEM_JSON = "application/problem+json"


class Problem(msgspec.Struct):
    """An error: ``title`` is its code (``not_found``, ``conflict``…), ``detail`` says why."""

    type: str
    title: str
    status: int
    detail: str


PROBLEMS = {
    status: ResponseSpec(
        Problem, description=description, media_type=PROBLEM_JSON, generate_examples=False
    )
    for status, description in (
        (400, "Invalid request (the detail names the field)"),
        (401, "Missing, unknown, revoked or expired credential"),
        (403, "The credential's scope or role does not allow this"),
        (404, "No such object (or another tenant's)"),
        (409, "Conflicts with an existing object"),
    )
}


class DocumentedController(Controller):
    """A controller whose handlers document the problem-details errors."""

    def get_route_handlers(self) -> list[BaseRouteHandler]:
        """The handlers, each with ``PROBLEMS`` added to its documented responses."""
        handlers = super().get_route_handlers()
        for handler in handlers:
            if isinstance(handler, HTTPRouteHandler):
                handler.responses = {**PROBLEMS, **(handler.responses or {})}
        return handlers
