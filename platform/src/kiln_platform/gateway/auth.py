"""Bearer-credential authentication for `/v1`."""

from __future__ import annotations

from typing import Any

from litestar import Request
from litestar.params import SkipValidation

from kiln_platform.context import Kiln
from kiln_platform.errors import Forbidden, Unauthorized
from kiln_platform.keys.services import Principal


async def provide_principal(
    request: Request[Any, Any, Any], kiln: SkipValidation[Kiln]
) -> Principal:
    """Authenticate ``Authorization: Bearer <key>`` and require the inference scope."""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized(
            "You didn't provide an API key. Provide it as 'Authorization: Bearer <key>'."
        )
    principal = await kiln.keys.verify(token.strip())
    if "inference" not in principal.scopes:
        raise Forbidden("This API key does not have the 'inference' scope.")
    return principal
