"""Bearer-credential authentication for `/v1` and `/v2` (``/admin/v1``: ``admin.deps``).

``authenticated`` guards every authenticated route: Litestar reads and validates a handler's
``data`` before it resolves dependencies, so with the dependency alone a request without a
valid key and with a malformed body was a 400 naming a field, not a 401 (OpenAI answers 401
first). The guard keeps the principal for ``provide_principal``."""

from __future__ import annotations

from typing import Any

from litestar import Request
from litestar.connection import ASGIConnection
from litestar.handlers import BaseRouteHandler
from litestar.params import SkipValidation

from kiln_platform.context import Kiln
from kiln_platform.errors import Forbidden, Unauthorized
from kiln_platform.keys.services import Principal
from kiln_platform.oauth.verifier import looks_like_jwt
from kiln_runtimes import tracing


async def _authenticate(header: str, kiln: Kiln) -> Principal:
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized(
            "You didn't provide an API key. Provide it as 'Authorization: Bearer <key>'."
        )
    return await verify_bearer(kiln, token.strip())


def _not_finance(principal: Principal) -> Principal:
    """Finance credentials read cost reports, statements and price books, and nothing else."""
    if principal.role == "finance":
        raise Forbidden("A finance credential may only read cost reports and statements.")
    return principal


async def verify_bearer(kiln: Kiln, token: str) -> Principal:
    """An API key (cached lookup) or a JWT access token (verified locally, no database)."""
    if looks_like_jwt(token):
        return await kiln.tokens.verify(token)
    return await kiln.keys.verify(token)


async def authenticated(
    connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler
) -> None:
    """The guard of the authenticated routes: the principal, before the body is read."""
    connection.state.principal = await _principal(connection, connection.app.state.kiln)


async def provide_principal(
    request: Request[Any, Any, Any], kiln: SkipValidation[Kiln]
) -> Principal:
    """The principal ``authenticated`` found (or, on a route it does not guard, found now)."""
    held: Principal | None = request.state.get("principal")
    return held if held is not None else await _principal(request, kiln)


async def _principal(connection: ASGIConnection[Any, Any, Any, Any], kiln: Kiln) -> Principal:
    """The key of ``Authorization: Bearer``, else of ``x-api-key`` (Anthropic's SDKs send it)."""
    given = connection.headers.get("authorization")
    if given is None and (key := connection.headers.get("x-api-key")):
        given = f"Bearer {key}"
    return await inference_principal(kiln, given or "")


async def inference_principal(kiln: Kiln, authorization: str) -> Principal:
    """Authenticate an ``Authorization: Bearer <key>`` value (a header, or gRPC's metadata) and
    require the inference scope (quotas are the admission's: ``admission.deps``)."""
    with tracing.span("auth"):
        principal = _not_finance(await _authenticate(authorization, kiln))
    if "inference" not in principal.scopes:
        raise Forbidden("This API key does not have the 'inference' scope.")
    return principal
