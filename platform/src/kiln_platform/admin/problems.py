"""The error responses of ``/admin/v1`` in its OpenAPI document.

``app._error_response`` answers every error outside ``/v1`` and ``/v2`` as RFC 9457 problem
details (``application/problem+json``); Litestar documents its own 400 as ``application/json``.
Admin controllers derive from ``DocumentedController`` so the document says what is sent
(schemathesis checks responses against it).
"""

from __future__ import annotations

from typing import ClassVar

import msgspec
from litestar.openapi import ResponseSpec

from kiln_platform import openapi

PROBLEM_JSON = "application/problem+json"


class Problem(msgspec.Struct):
    """An error: ``title`` is its code (``not_found``, ``conflict``…), ``detail`` says why."""

    type: str
    title: str
    status: int
    detail: str


PROBLEMS = openapi.responses(
    Problem,
    {
        400: "Invalid request (the detail names the field)",
        401: "Missing, unknown, revoked or expired credential",
        403: "The credential's scope or role does not allow this",
        404: "No such object (or another tenant's)",
        409: "Conflicts with an existing object (or a running Idempotency-Key)",
        413: "The request body is larger than this route accepts",
        422: "This Idempotency-Key was used with another body",
    },
    PROBLEM_JSON,
)


class DocumentedController(openapi.DocumentedController):
    """An admin controller: its handlers document the problem-details errors."""

    errors: ClassVar[dict[int, ResponseSpec]] = PROBLEMS
