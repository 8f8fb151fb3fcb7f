"""What every ``/admin/v1`` handler depends on: authentication (API keys, OAuth JWTs), the
authorization guard, the actor-scoped transaction and the controllers' base class."""

from __future__ import annotations

from contextlib import AsyncExitStack, asynccontextmanager
from typing import TYPE_CHECKING, Any

from litestar import Request
from litestar.di import Provide
from litestar.params import SkipValidation
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncSession

from kiln_platform.admin.authz import Actor, Role, actor_tenant, check_tenant, require
from kiln_platform.admin.problems import DocumentedController
from kiln_platform.context import Kiln
from kiln_platform.db import after_commit
from kiln_platform.db.engine import confine
from kiln_platform.errors import BadRequest, Forbidden, Unauthorized
from kiln_platform.gateway.auth import verify_bearer

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from litestar.connection import ASGIConnection
    from litestar.handlers import BaseRouteHandler

BAD_TEXT = frozenset({"22P05", "22021"})
"""SQLSTATEs of text PostgreSQL cannot store (untranslatable character, e.g. NUL; bad UTF-8)."""


def bearer(request: ASGIConnection[Any, Any, Any, Any]) -> str:
    """The bearer credential, or ``Unauthorized``."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("Provide a credential as 'Authorization: Bearer <key or token>'.")
    return token.strip()


def source_of(request: ASGIConnection[Any, Any, Any, Any]) -> str | None:
    """The peer address of a request."""
    return request.client.host if request.client else None


async def authenticate(request: ASGIConnection[Any, Any, Any, Any], kiln: Kiln) -> Actor:
    """Who calls ``/admin/v1``: a key or token with an admin scope (else 403); once a request."""
    known: Actor | None = request.state.get("actor")
    if known is not None:
        return known
    token = bearer(request)
    principal = await verify_bearer(kiln, token)
    oauth = principal.name.startswith("oauth:")
    name = principal.name if oauth else f"key:{principal.name}"
    if not {"admin:read", "admin:write"} & principal.scopes:
        raise Forbidden("This credential does not have an admin scope.")
    role = Role(principal.role)
    if role is Role.FINANCE and request.scope.get("method") not in {"GET", "HEAD"}:
        raise Forbidden("A finance credential may only read cost reports and statements.")
    actor = Actor(
        name=name,
        role=role,
        tenant_id=actor_tenant(role, principal.tenant_id),
        scopes=principal.scopes,
        request_id=request.state.get("request_id"),
        source=source_of(request),
    )
    request.state.actor = actor
    return actor


async def provide_actor(request: Request[Any, Any, Any], kiln: SkipValidation[Kiln]) -> Actor:
    """The ``actor`` dependency of every ``/admin/v1`` handler."""
    return await authenticate(request, kiln)


READS = frozenset({"GET", "HEAD"})


async def authorize(
    connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler
) -> None:
    """The guard of every ``/admin/v1`` handler: the actor may read (GET) or write (any other
    method) the handler's ``opt["resource"]`` (``authz._RULES``); a ``tenant_id`` path parameter
    of a tenant it cannot see is ``NotFound``, as in the services (which check again, per object).

    A guard because Litestar reads a handler's ``data`` (JSON or a multipart upload) before it
    resolves dependencies: ``provide_actor`` alone would refuse only after the whole body came.
    A handler without a resource is refused (fail closed).
    """
    actor = await authenticate(connection, connection.app.state.kiln)
    resource = handler.opt.get("resource")
    if resource is None:
        raise Forbidden("This route declares no resource to authorize.")
    tenant = connection.path_params.get("tenant_id")
    if tenant is not None:
        check_tenant(actor, tenant, "tenant")
    require(actor, resource, write=connection.scope.get("method") not in READS)


def bad_text(exc: BaseException) -> bool:
    """Whether ``exc`` is PostgreSQL refusing text it cannot store: the caller's error, 400."""
    return isinstance(exc, DBAPIError) and getattr(exc.orig, "sqlstate", None) in BAD_TEXT


BAD_TEXT_MESSAGE = "Text fields may not contain NUL characters."


@asynccontextmanager
async def _begin(kiln: Kiln, actor: Actor) -> AsyncIterator[AsyncSession]:
    """The actor's transaction; what the services deferred to the commit runs once committed."""
    async with kiln.db.sessions.begin() as session:
        if actor.tenant_id is not None:
            await confine(session, actor.tenant_id)
        yield session
    await after_commit.run(session)  # the services' cache invalidation, now that it is true


@asynccontextmanager
async def transaction(kiln: Kiln, actor: Actor) -> AsyncIterator[AsyncSession]:
    """A transaction for an admin action; what the services deferred to the commit
    (``db.after_commit``: cache invalidation) runs once it has committed.

    For an actor confined to a tenant it also runs as the ``kiln_tenant`` database role with
    ``kiln.tenant_id`` set, so PostgreSQL's row-level security hides every other tenant's rows
    even if a service forgot a filter (the second wall; ``kiln_tenant`` has no platform-scope
    policy, and the scope is withdrawn too). Text PostgreSQL cannot store (a NUL
    character) is the caller's error: 400, not 500.
    """
    try:
        async with _begin(kiln, actor) as session:
            yield session
    except DBAPIError as exc:
        if not bad_text(exc):
            raise
        raise BadRequest(BAD_TEXT_MESSAGE) from exc


class AdminCall:
    """One ``/admin/v1`` request's context: the deployment (``kiln``), the authenticated
    ``actor`` and, begun on first use, the actor's transaction (``session()``)."""

    def __init__(self, kiln: Kiln, actor: Actor, stack: AsyncExitStack) -> None:
        self.kiln = kiln
        self.actor = actor
        self._stack = stack
        self._session: AsyncSession | None = None

    @property
    def hmac_key(self) -> bytes:
        """The deployment's key for credential digests (``Settings.hmac_key``)."""
        return self.kiln.settings.hmac_key()

    async def session(self) -> AsyncSession:
        """The actor's transaction (as ``transaction``), begun on the first call and committed
        after the handler returns, before the response is sent; a handler that manages its
        own transactions (an upload, a stream) never calls it and holds no connection."""
        if self._session is None:
            self._session = await self._stack.enter_async_context(_begin(self.kiln, self.actor))
        return self._session


async def provide_call(
    kiln: SkipValidation[Kiln], actor: SkipValidation[Actor]
) -> AsyncIterator[AdminCall]:
    """The ``call`` dependency of every ``/admin/v1`` handler (``AdminCall``).

    A handler's exception passes through unchanged (Litestar would wrap a new one in an
    ``ExceptionGroup``), so text PostgreSQL refuses becomes 400 in ``app._error_response``.
    """
    async with AsyncExitStack() as stack:
        yield AdminCall(kiln, actor, stack)


CallDep = SkipValidation[AdminCall]


class AdminController(DocumentedController):
    """Base of the admin controllers: every handler is authorized by ``authorize`` (its
    ``opt["resource"]`` read or written, before its body is read) and gets its ``call``
    (``AdminCall``: the deployment, the actor, the actor's transaction)."""

    path = "/admin/v1"
    guards = [authorize]  # noqa: RUF012
    dependencies = {"actor": Provide(provide_actor), "call": Provide(provide_call)}  # noqa: RUF012
    tags = ["admin"]  # noqa: RUF012
