"""OpenID Connect single sign-on for the console: the authorization code flow with PKCE.

``/console/sso`` sends the browser to the provider with a fresh ``state``, ``nonce`` and PKCE
verifier kept in the (encrypted) session; ``/console/sso/callback`` checks the state, exchanges
the code (client secret over HTTP Basic), and verifies the ID token against the provider's JWKS:
signature, ``iss``, ``aud``, ``exp`` and the ``nonce``. The token's verified ``email`` must be a
console user's: SSO signs existing users in, it does not create them (roles stay Kiln's). The
first sign-in binds the user to the token's ``(iss, sub)``, which decides from then on.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
import time
from typing import Any
from urllib.parse import urlencode

import aiohttp
from joserfc import jwt
from joserfc.errors import JoseError
from joserfc.jwk import KeySet

from kiln_platform.errors import Forbidden, ServiceUnavailable, Unauthorized
from kiln_platform.users.schemas import VerifiedIdentity

CACHE_S = 300.0
ALGORITHMS = ["RS256", "ES256", "PS256"]


def vouched_email(claims: dict[str, Any], *, require_verified: bool) -> str:
    """The ID token's email, if the provider vouches for it: ``email_verified`` is true, or, when
    not required, at least not false."""
    email, verified = claims.get("email"), claims.get("email_verified")
    vouched = verified is True if require_verified else verified is not False
    if not isinstance(email, str) or not email or not vouched:
        raise Forbidden("The SSO provider did not vouch for an email address.")
    return email


class OpenIDProvider:
    """One configured provider: its discovery document and keys, cached for five minutes."""

    def __init__(
        self, issuer: str, client_id: str, client_secret: str, scopes: str, label: str,
        *, require_verified: bool = True,
    ) -> None:  # fmt: skip
        self.issuer = issuer.rstrip("/")
        self.label = label
        """The sign-in button's text."""
        self._require_verified = require_verified
        self._client = (client_id, client_secret)
        self._scopes = scopes
        self._metadata: dict[str, Any] = {}
        self._keys: KeySet | None = None
        self._fetched = float("-inf")

    def start(self, redirect_uri: str) -> tuple[str, dict[str, str]]:
        """The authorization URL, and the flow state the callback must find in the session."""
        flow = {"state": secrets.token_urlsafe(24), "nonce": secrets.token_urlsafe(24),
                "verifier": secrets.token_urlsafe(48)}  # fmt: skip
        challenge = base64.urlsafe_b64encode(hashlib.sha256(flow["verifier"].encode()).digest())
        query = {
            "response_type": "code", "client_id": self._client[0], "redirect_uri": redirect_uri,
            "scope": self._scopes, "state": flow["state"], "nonce": flow["nonce"],
            "code_challenge": challenge.rstrip(b"=").decode(), "code_challenge_method": "S256",
        }  # fmt: skip
        return f"{self._metadata['authorization_endpoint']}?{urlencode(query)}", flow

    async def discover(self) -> None:
        """Fetch (or reuse) the discovery document and the JWKS."""
        if time.monotonic() - self._fetched < CACHE_S and self._keys is not None:
            return
        async with aiohttp.ClientSession() as http:
            metadata = await _json(http, "GET", f"{self.issuer}/.well-known/openid-configuration")
            if metadata.get("issuer", "").rstrip("/") != self.issuer:
                raise ServiceUnavailable(
                    "The SSO provider's discovery document names another issuer."
                )
            keys = KeySet.import_key_set(await _json(http, "GET", metadata["jwks_uri"]))  # type: ignore[arg-type]
        self._metadata, self._keys, self._fetched = metadata, keys, time.monotonic()

    async def finish(
        self, params: dict[str, str], flow: dict[str, str], redirect_uri: str
    ) -> VerifiedIdentity:
        """Who the provider sent back: issuer, subject, vouched email (else ``Unauthorized``)."""
        if "error" in params:
            raise Unauthorized(f"The SSO provider refused the sign-in: {params['error']}.")
        if not flow or not secrets.compare_digest(params.get("state", ""), flow["state"]):
            raise Unauthorized("The sign-in expired or did not start here; try again.")
        await self.discover()
        form = {"grant_type": "authorization_code", "code": params.get("code", ""),
                "redirect_uri": redirect_uri, "code_verifier": flow["verifier"]}  # fmt: skip
        async with aiohttp.ClientSession() as http:
            tokens = await _json(http, "POST", self._metadata["token_endpoint"], data=form,
                                 auth=aiohttp.BasicAuth(*self._client))  # fmt: skip
        claims = self._verify(str(tokens.get("id_token", "")), flow["nonce"])
        email = vouched_email(claims, require_verified=self._require_verified)
        subject = claims.get("sub")
        if not isinstance(subject, str) or not subject or len(subject) > 255:
            raise Unauthorized("The SSO provider's ID token names no subject (sub).")
        return VerifiedIdentity(self.issuer, subject, email)

    def _verify(self, id_token: str, nonce: str) -> dict[str, Any]:
        assert self._keys is not None
        registry = jwt.JWTClaimsRegistry(
            iss={"essential": True, "value": self.issuer},
            aud={"essential": True, "value": self._client[0]},
            exp={"essential": True}, nonce={"essential": True, "value": nonce},
        )  # fmt: skip
        try:
            claims: dict[str, Any] = jwt.decode(id_token, self._keys, algorithms=ALGORITHMS).claims
            registry.validate(claims)
        except (JoseError, ValueError, TypeError) as exc:
            raise Unauthorized(f"The SSO provider's ID token is not valid ({exc}).") from None
        return claims


async def _json(http: aiohttp.ClientSession, method: str, url: str, **kw: Any) -> dict[str, Any]:
    try:
        async with http.request(method, url, timeout=aiohttp.ClientTimeout(10), **kw) as r:
            body = await r.json(content_type=None)
            if r.status != 200 or not isinstance(body, dict):
                raise Unauthorized(f"The SSO provider answered {r.status} at {url}.")
            return body
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise ServiceUnavailable(f"The SSO provider is unreachable ({exc}).") from None
