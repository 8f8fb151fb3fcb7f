"""authlib's framework-neutral ``AuthorizationServer``, driven from Litestar.

authlib is synchronous, so the service does the database work first (the client named in the
request, the signing key, the presented token's claims) and builds one server per request around
what it found; authlib then does the protocol: client authentication (HTTP Basic or form),
grant and scope checks, RFC 9068 token generation, RFC 7662 / RFC 7009 endpoint logic, errors.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from hashlib import sha256
from typing import Any

from authlib.oauth2 import AuthorizationServer
from authlib.oauth2.rfc6749 import ClientMixin, OAuth2Payload, OAuth2Request, TokenMixin
from authlib.oauth2.rfc6749.grants import ClientCredentialsGrant
from authlib.oauth2.rfc7009 import RevocationEndpoint
from authlib.oauth2.rfc7662 import IntrospectionEndpoint
from authlib.oauth2.rfc9068 import JWTBearerTokenGenerator
from joserfc.jwk import KeySet, RSAKey

from kiln_platform.oauth.keys import ALG

AUTH_METHODS = ["client_secret_basic", "client_secret_post"]


@dataclass(frozen=True)
class FormRequest:
    """What authlib needs of an HTTP request (the form already read by the async handler)."""

    method: str
    url: str
    headers: Mapping[str, str]
    form: dict[str, str]


class _Payload(OAuth2Payload):  # type: ignore[misc]
    def __init__(self, form: dict[str, str]) -> None:
        self._form = form

    @property
    def data(self) -> dict[str, str]:
        return self._form

    @property
    def datalist(self) -> dict[str, list[str]]:
        return {k: [v] for k, v in self._form.items()}


class _Request(OAuth2Request):  # type: ignore[misc]
    def __init__(self, req: FormRequest) -> None:
        super().__init__(req.method, req.url, headers=req.headers)
        self.payload = _Payload(req.form)
        self._form = req.form

    @property
    def args(self) -> dict[str, str]:
        return {}

    @property
    def form(self) -> dict[str, str]:
        return self._form


@dataclass(frozen=True)
class Client(ClientMixin):  # type: ignore[misc]
    """A registered client as authlib sees it."""

    client_id: str
    tenant_id: str
    scopes: frozenset[str]
    secret_digest: bytes
    hmac_key: bytes = field(repr=False)

    def get_client_id(self) -> str:
        return self.client_id

    def check_client_secret(self, client_secret: str) -> bool:
        digest = hmac.new(self.hmac_key, client_secret.encode(), sha256).digest()
        return hmac.compare_digest(digest, self.secret_digest)

    def check_endpoint_auth_method(self, method: str, endpoint: str) -> bool:
        return bool(method in AUTH_METHODS)

    def check_grant_type(self, grant_type: str) -> bool:
        return bool(grant_type == ClientCredentialsGrant.GRANT_TYPE)

    def get_allowed_scope(self, scope: str | None) -> str | None:
        """All the client's scopes if none are asked for; None (invalid_scope) beyond them."""
        asked = set((scope or "").split()) or set(self.scopes)
        return " ".join(sorted(asked)) if asked <= self.scopes else None


@dataclass(frozen=True)
class AccessToken(TokenMixin):  # type: ignore[misc]
    """A verified JWT access token presented for introspection or revocation."""

    claims: dict[str, Any]
    revoked: bool = False

    def check_client(self, client: Client) -> bool:
        return bool(self.claims["client_id"] == client.client_id)

    def get_scope(self) -> str:
        return str(self.claims.get("scope") or "")

    def get_expires_in(self) -> int:
        return int(self.claims["exp"]) - int(self.claims["iat"])

    def is_expired(self) -> bool:
        return int(self.claims["exp"]) <= time.time()

    def is_revoked(self) -> bool:
        return self.revoked


class _Grant(ClientCredentialsGrant):  # type: ignore[misc]
    TOKEN_ENDPOINT_AUTH_METHODS = AUTH_METHODS


class _Introspection(IntrospectionEndpoint):  # type: ignore[misc]
    CLIENT_AUTH_METHODS = AUTH_METHODS
    SUPPORTED_TOKEN_TYPES = ("access_token",)

    def query_token(self, token_string: str, token_type_hint: str | None) -> AccessToken | None:
        token: AccessToken | None = self.server.token
        return token

    def check_permission(self, token: AccessToken, client: Client, request: Any) -> bool:
        """A client may introspect the tokens of its own tenant's clients."""
        return bool(token.claims["tenant"] == client.tenant_id)

    def introspect_token(self, token: AccessToken) -> dict[str, Any]:
        c = token.claims
        keys = ("client_id", "scope", "sub", "aud", "iss", "exp", "iat", "jti", "tenant")
        return {"active": True, "token_type": "Bearer", **{k: c[k] for k in keys if k in c}}


class _Revocation(RevocationEndpoint):  # type: ignore[misc]
    CLIENT_AUTH_METHODS = AUTH_METHODS
    SUPPORTED_TOKEN_TYPES = ("access_token",)

    def query_token(self, token_string: str, token_type_hint: str | None) -> AccessToken | None:
        token: AccessToken | None = self.server.token
        return token

    def revoke_token(self, token: AccessToken, request: Any) -> None:
        self.server.revoked.append(token)  # the service writes the denylist afterwards


class _Generator(JWTBearerTokenGenerator):  # type: ignore[misc]
    def __init__(self, key: RSAKey, issuer: str, audience: str, ttl_s: int) -> None:
        super().__init__(issuer=issuer, alg=ALG, expires_generator=ttl_s)
        self._key, self._audience = key, audience

    def get_jwks(self) -> KeySet:
        return KeySet([self._key])

    def get_audiences(self, client: Client, user: Any, scope: str) -> str:
        return self._audience

    def get_extra_claims(
        self, client: Client, grant_type: str, user: Any, scope: str
    ) -> dict[str, str]:
        return {"tenant": client.tenant_id}


class KilnAuthorizationServer(AuthorizationServer):  # type: ignore[misc]
    """One request's server: the client it may name, the presented token, the signing key."""

    def __init__(
        self, client: Client | None, *, token: AccessToken | None = None,
        signer: _Generator | None = None,
    ) -> None:  # fmt: skip
        super().__init__(scopes_supported=None)
        self.client, self.token = client, token
        self.revoked: list[AccessToken] = []
        self.register_grant(_Grant)
        self.register_endpoint(_Introspection)
        self.register_endpoint(_Revocation)
        if signer is not None:
            self.register_token_generator("default", signer)

    def query_client(self, client_id: str) -> Client | None:
        return self.client if self.client and self.client.client_id == client_id else None

    def save_token(self, token: dict[str, Any], request: Any) -> None:
        """Self-contained JWTs: nothing to store."""

    def send_signal(self, name: str, *args: Any, **kwargs: Any) -> None:
        """No signal system here."""

    def create_oauth2_request(self, request: FormRequest | OAuth2Request) -> OAuth2Request:
        return request if isinstance(request, OAuth2Request) else _Request(request)

    def handle_response(
        self, status: int, body: Any, headers: list[tuple[str, str]]
    ) -> tuple[int, Any, dict[str, str]]:
        return status, body, dict(headers)


def signer(key: RSAKey, issuer: str, audience: str, ttl_s: int) -> _Generator:
    """The RFC 9068 token generator for one signing key."""
    return _Generator(key, issuer, audience, ttl_s)
