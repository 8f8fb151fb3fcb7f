"""``/oauth/token``, ``/oauth/introspect``, ``/oauth/revoke``, ``/.well-known/jwks.json`` and
``/.well-known/oauth-authorization-server``: adapt the Litestar request for authlib
(``oauth.services``) and its reply back."""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, get, post
from litestar.params import SkipValidation

from kiln_platform.admin.deps import source_of
from kiln_platform.context import Kiln
from kiln_platform.oauth import services
from kiln_platform.oauth._server import FormRequest
from kiln_platform.openapi import OAUTH_ERRORS, DocumentedController

KilnDep = SkipValidation[Kiln]
AnyRequest = Request[Any, Any, Any]


async def _form_request(request: AnyRequest) -> FormRequest:
    form = await request.form()
    return FormRequest(
        method=request.method,
        url=str(request.url),
        headers=request.headers,  # case-insensitive: authlib asks for 'Authorization'
        form={k: v for k, v in form.items() if isinstance(v, str)},
    )


def _reply(status: int, body: Any, headers: dict[str, str]) -> Response[Any]:
    headers = {k: v for k, v in headers.items() if k.lower() != "content-type"}
    return Response(body, status_code=status, headers=headers, media_type="application/json")


class OAuthController(DocumentedController):
    """The OAuth2 authorization server (client credentials; RFC 9068, 7662, 7009)."""

    tags = ["oauth"]  # noqa: RUF012
    errors = OAUTH_ERRORS

    @post("/oauth/token", status_code=200)
    async def token(self, kiln: KilnDep, request: AnyRequest) -> Response[Any]:
        """Client credentials grant (HTTP Basic or form client auth) → a JWT access token."""
        return _reply(*await services.token(kiln, await _form_request(request)))

    @post("/oauth/introspect", status_code=200)
    async def introspect(self, kiln: KilnDep, request: AnyRequest) -> Response[Any]:
        """RFC 7662 token introspection, for a client of the token's tenant."""
        return _reply(*await services.introspect(kiln, await _form_request(request)))

    @post("/oauth/revoke", status_code=200)
    async def revoke(self, kiln: KilnDep, request: AnyRequest) -> Response[Any]:
        """RFC 7009 revocation: refused by every gateway within the denylist cache TTL (5 s)."""
        req = await _form_request(request)
        reply = await services.revoke(kiln, req, request.state.request_id, source_of(request))
        return _reply(*reply)

    @get("/.well-known/jwks.json")
    async def jwks(self, kiln: KilnDep) -> dict[str, Any]:
        """The public keys that verify access tokens (current and recently rotated)."""
        return await services.jwks(kiln)

    @get("/.well-known/oauth-authorization-server")
    async def metadata(self, kiln: KilnDep, request: AnyRequest) -> dict[str, Any]:
        """RFC 8414 metadata: where the token, key, introspection and revocation endpoints are
        (at the URL this request came to) and what they take."""
        return services.metadata(kiln.settings.oauth_issuer, str(request.base_url).rstrip("/"))
