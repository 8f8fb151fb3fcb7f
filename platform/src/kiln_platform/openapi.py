"""The error responses each API documents in the OpenAPI document.

``app._error_response`` answers every error in its API's shape: OpenAI's error object on
``/v1`` (Anthropic's on ``/v1/messages``), ``{"error": ...}`` on ``/v2`` (the Open Inference
Protocol), RFC 6749 error bodies on ``/oauth`` and RFC 9457 problem details elsewhere.
Controllers derive from ``DocumentedController`` and name their ``errors`` so the document
says what is sent (schemathesis checks every response against it).
"""

from __future__ import annotations

from typing import Any, ClassVar

import msgspec
from litestar import Controller
from litestar.handlers import BaseRouteHandler, HTTPRouteHandler
from litestar.openapi import ResponseSpec

from kiln_platform.gateway.schemas import ErrorResponse


class OIPError(msgspec.Struct):
    """An Open Inference Protocol error."""

    error: str


class AnthropicErrorBody(msgspec.Struct):
    type: str
    message: str


class AnthropicError(msgspec.Struct):
    """Anthropic's error object (``/v1/messages``)."""

    type: str
    error: AnthropicErrorBody


class OAuthError(msgspec.Struct, omit_defaults=True):
    """An RFC 6749 error response."""

    error: str
    error_description: str | None = None


def responses(
    body: Any, statuses: dict[int, str], media_type: str = "application/json"
) -> dict[int, ResponseSpec]:
    """One documented response per status, all with the same error body."""
    return {
        status: ResponseSpec(
            body, description=description, media_type=media_type, generate_examples=False
        )
        for status, description in statuses.items()
    }


_COMMON = {
    400: "Invalid request (the error names the field)",
    401: "Missing, unknown, revoked or expired credential",
    403: "The credential's scope or role does not allow this",
    404: "No such model (or object)",
    408: "The request body stalled or trickled (KILN_BODY_TIMEOUT_S); the connection is closed",
    413: "The request body is larger than this route accepts",
}
_SERVING = {
    **_COMMON,
    409: "A request with this Idempotency-Key is still running",
    422: "This Idempotency-Key was used with another body",
    429: "A rate limit, the month's budget, or too many connections from the client's address "
    "(Retry-After says when to retry)",
    503: "No worker can take the request now (Retry-After says when to retry)",
    504: "The worker did not answer in time",
}
OPENAI_ERRORS = responses(ErrorResponse, _SERVING)
OIP_ERRORS = responses(OIPError, _SERVING)
ANTHROPIC_ERRORS = responses(AnthropicError, _SERVING)
OAUTH_ERRORS = responses(
    OAuthError,
    {400: "Invalid request, grant or scope (RFC 6749)", 401: "Client authentication failed"},
)


class DocumentedController(Controller):
    """A controller whose handlers document the errors of their API."""

    errors: ClassVar[dict[int, ResponseSpec]] = {}

    def get_route_handlers(self) -> list[BaseRouteHandler]:
        """The handlers, each with ``errors`` added to its documented responses."""
        handlers = super().get_route_handlers()
        for handler in handlers:
            if isinstance(handler, HTTPRouteHandler):
                handler.responses = {**self.errors, **(handler.responses or {})}
        return handlers
