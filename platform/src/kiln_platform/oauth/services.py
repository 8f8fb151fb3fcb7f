"""OAuth2 client credentials: clients (secret shown once, HMAC-hashed), the token, introspection
and revocation endpoints (authlib, see ``_server``), the JWKS and key rotation."""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from authlib.oauth2 import OAuth2Error
from authlib.oauth2.rfc6749.util import extract_basic_authorization
from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert

from kiln_platform.admin.authz import Actor, Role, require
from kiln_platform.audit.services import record, snapshot
from kiln_platform.db.tables import OAuthClient, RevokedToken
from kiln_platform.errors import NotFound, Unauthorized
from kiln_platform.keys.services import SCOPES, key_digest
from kiln_platform.oauth import keys
from kiln_platform.oauth._server import (
    AccessToken,
    Client,
    FormRequest,
    KilnAuthorizationServer,
    signer,
)
from kiln_platform.oauth.schemas import ClientCreate, ClientCreated, ClientView
from kiln_platform.oauth.verifier import looks_like_jwt, role_of
from kiln_platform.tenants.services import get_tenant

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

    from kiln_platform.context import Kiln

Reply = tuple[int, Any, dict[str, str]]
CLIENT_FIELDS = ("id", "client_id", "name", "scopes", "revoked_at")


async def create_client(
    session: AsyncSession, actor: Actor, tenant_id: uuid.UUID, data: ClientCreate, hmac_key: bytes
) -> ClientCreated:
    """Register a client of a tenant; its secret is in the result only."""
    await get_tenant(session, actor, tenant_id)
    require(actor, "oauth-clients", write=True)
    secret = f"kiln-secret-{secrets.token_urlsafe(32)}"
    row = OAuthClient(
        tenant_id=tenant_id, client_id=f"kiln-client-{secrets.token_hex(8)}",
        secret_digest=key_digest(hmac_key, secret), name=data.name, scopes=sorted(set(data.scopes)),
    )  # fmt: skip
    session.add(row)
    await session.flush()
    await record(session, actor, "oauth_client.create", "oauth_client", row.id, tenant_id,
                 after=snapshot(row, *CLIENT_FIELDS))  # fmt: skip
    return ClientCreated(client=client_view(row), client_secret=secret)


async def list_clients(
    session: AsyncSession, actor: Actor, tenant_id: uuid.UUID
) -> list[ClientView]:
    """A tenant's OAuth clients, newest first; never secrets."""
    await get_tenant(session, actor, tenant_id)
    require(actor, "oauth-clients")
    rows = await session.scalars(
        select(OAuthClient)
        .where(OAuthClient.tenant_id == tenant_id)
        .order_by(OAuthClient.created_at.desc(), OAuthClient.client_id)
    )
    return [client_view(c) for c in rows]


async def revoke_client(
    session: AsyncSession, actor: Actor, tenant_id: uuid.UUID, client_id: uuid.UUID
) -> ClientView:
    """Revoke a client: no new tokens, and gateways refuse its tokens within the cache TTL."""
    await get_tenant(session, actor, tenant_id)
    row = await session.get(OAuthClient, client_id)
    if row is None or row.tenant_id != tenant_id:
        raise NotFound("No such OAuth client.")
    require(actor, "oauth-clients", write=True)
    if row.revoked_at is None:
        before = snapshot(row, *CLIENT_FIELDS)
        row.revoked_at = datetime.now(UTC)
        await session.flush()
        await record(session, actor, "oauth_client.revoke", "oauth_client", row.id, tenant_id,
                     before=before, after=snapshot(row, *CLIENT_FIELDS))  # fmt: skip
    return client_view(row)


async def rotate_keys(session: AsyncSession, actor: Actor, secret: bytes) -> str:
    """Add a new active signing key; the old ones stay in the JWKS until their tokens expire."""
    require(actor, "signing-keys", write=True)
    row, retired = await keys.rotate(session, keys.key_seal(secret))
    await record(session, actor, "oauth_key.rotate", "signing_key", row.kid, None,
                 before={"active": retired}, after={"active": [row.kid]})  # fmt: skip
    return row.kid


async def jwks(kiln: Kiln) -> dict[str, Any]:
    """The published keys (the first call anywhere generates the first one)."""
    await kiln.tokens.keyring.signing_key()
    return await kiln.tokens.keyring.jwks()


CLIENT_AUTH = ["client_secret_basic", "client_secret_post"]


def metadata(issuer: str, base: str) -> dict[str, Any]:
    """RFC 8414 authorization server metadata: the endpoints under ``base`` (the URL the
    caller reached this server at) and what they take."""
    return {
        "issuer": issuer,
        "token_endpoint": f"{base}/oauth/token",
        "jwks_uri": f"{base}/.well-known/jwks.json",
        "introspection_endpoint": f"{base}/oauth/introspect",
        "revocation_endpoint": f"{base}/oauth/revoke",
        "grant_types_supported": ["client_credentials"],
        "response_types_supported": [],  # no authorization endpoint: tokens come from /token
        "scopes_supported": sorted(SCOPES),
        "token_endpoint_auth_methods_supported": CLIENT_AUTH,
        "introspection_endpoint_auth_methods_supported": CLIENT_AUTH,
        "revocation_endpoint_auth_methods_supported": CLIENT_AUTH,
    }


async def token(kiln: Kiln, req: FormRequest) -> Reply:
    """``POST /oauth/token``: client credentials grant → an RFC 9068 JWT access token."""
    client = await _client_of(kiln, req)
    s = kiln.settings
    sign = None
    if client is not None:
        key = await kiln.tokens.keyring.signing_key()
        sign = signer(key, s.oauth_issuer, s.oauth_audience, s.oauth_token_ttl_s)
    server = KilnAuthorizationServer(client, signer=sign)
    return _run(server, lambda: server.create_token_response(req))


async def introspect(kiln: Kiln, req: FormRequest) -> Reply:
    """``POST /oauth/introspect`` (RFC 7662), for clients of the token's tenant."""
    client = await _client_of(kiln, req)
    presented = await _presented(kiln, req) if client is not None else None
    server = KilnAuthorizationServer(client, token=presented)
    return _run(server, lambda: server.create_endpoint_response("introspection", req))


async def revoke(kiln: Kiln, req: FormRequest, request_id: str | None, source: str | None) -> Reply:
    """``POST /oauth/revoke`` (RFC 7009): the token's jti joins the denylist (audited)."""
    client = await _client_of(kiln, req)
    presented = await _presented(kiln, req) if client is not None else None
    server = KilnAuthorizationServer(client, token=presented)
    reply = _run(server, lambda: server.create_endpoint_response("revocation", req))
    for revoked in server.revoked:
        assert client is not None  # a token is revoked only for an authenticated client
        claims = revoked.claims
        expires = datetime.fromtimestamp(int(claims["exp"]), UTC)
        actor = Actor(f"oauth:{client.client_id}", Role(role_of(client.scopes)),
                      uuid.UUID(client.tenant_id), client.scopes, request_id, source)  # fmt: skip
        async with kiln.db.sessions.begin() as session:
            added = await session.scalar(
                insert(RevokedToken).values(jti=claims["jti"], expires_at=expires)
                .on_conflict_do_nothing().returning(RevokedToken.jti)
            )  # fmt: skip
            if added is not None:
                after = {"jti": claims["jti"], "exp": claims["exp"]}
                await record(session, actor, "oauth_token.revoke", "oauth_token", claims["jti"],
                             actor.tenant_id, after=after)  # fmt: skip
    return reply


def _run(server: KilnAuthorizationServer, call: Callable[[], Reply]) -> Reply:
    try:
        return call()
    except OAuth2Error as error:  # raised before authlib's own handling (e.g. insecure transport)
        return server.handle_error_response(None, error)  # type: ignore[no-any-return]


async def _client_of(kiln: Kiln, req: FormRequest) -> Client | None:
    """The active client the request names (HTTP Basic or form); authlib checks its secret."""
    client_id, _ = extract_basic_authorization(req.headers)
    client_id = client_id or req.form.get("client_id")
    if not client_id:
        return None
    async with kiln.db.sessions() as session:
        row = await session.scalar(
            select(OAuthClient).where(
                OAuthClient.client_id == client_id, OAuthClient.revoked_at.is_(None)
            )
        )
    if row is None:
        return None
    return Client(row.client_id, str(row.tenant_id), frozenset(row.scopes), row.secret_digest,
                  kiln.settings.hmac_key())  # fmt: skip


async def _presented(kiln: Kiln, req: FormRequest) -> AccessToken | None:
    """The presented token if it is one of ours and unexpired (else: inactive / nothing to do)."""
    raw = req.form.get("token", "")
    if not looks_like_jwt(raw):
        return None
    try:
        claims = await kiln.tokens.claims(raw)
    except Unauthorized:
        return None
    async with kiln.db.sessions() as session:
        revoked = await session.get(RevokedToken, str(claims["jti"]))
    return AccessToken(claims, revoked=revoked is not None)


def client_view(c: OAuthClient) -> ClientView:
    """Wire form of a client."""
    return ClientView(
        id=c.id, tenant_id=c.tenant_id, client_id=c.client_id, name=c.name,
        scopes=list(c.scopes), created_at=c.created_at, revoked_at=c.revoked_at,
    )  # fmt: skip
