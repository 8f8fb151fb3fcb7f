"""Console users: local accounts with argon2 hashes and one role each."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError

from kiln_platform.admin.authz import GLOBAL_ROLES, Actor, Role, check_tenant, grantable, require
from kiln_platform.audit.services import record, snapshot
from kiln_platform.db.tables import User
from kiln_platform.errors import BadRequest, Conflict, Forbidden, NotFound, Unauthorized
from kiln_platform.tenants.services import get_tenant
from kiln_platform.users._passwords import hash_password, verify
from kiln_platform.users.schemas import UserCreate, UserUpdate, UserView, VerifiedIdentity

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

FIELDS = ("id", "email", "role", "tenant_id")


async def create_user(session: AsyncSession, actor: Actor, data: UserCreate) -> UserView:
    """Create a user; tenant roles need a tenant the actor may see, global roles none."""
    tenant_id = data.tenant_id if data.tenant_id is not None else actor.tenant_id
    if tenant_id is not None:
        await get_tenant(session, actor, tenant_id)
    require(actor, "users", write=True)
    role = Role(data.role)
    grantable(actor, role)
    if not 8 <= len(data.password) <= 1024:
        raise BadRequest("A password must be 8 to 1024 characters.", param="password")
    if role in (Role.TENANT_ADMIN, Role.TENANT_MEMBER) and tenant_id is None:
        raise BadRequest(f"A {role} user needs a tenant.", param="tenant_id")
    if role is Role.PLATFORM_ADMIN:
        tenant_id = None
    user = User(
        email=data.email.lower(), password_hash=await hash_password(data.password), role=role,
        tenant_id=tenant_id,
    )  # fmt: skip
    session.add(user)
    try:
        await session.flush()
    except IntegrityError as exc:
        raise Conflict("A user with this email already exists.", param="email") from exc
    await record(session, actor, "user.create", "user", user.id, tenant_id,
                 after=snapshot(user, *FIELDS))  # fmt: skip
    return user_view(user)


async def get_user(session: AsyncSession, actor: Actor, user_id: uuid.UUID) -> User:
    """A user the actor may see (another tenant's is ``NotFound``, before any role check)."""
    user = await session.get(User, user_id)
    if user is None:
        raise NotFound("No such user.")
    check_tenant(actor, user.tenant_id, "user")
    require(actor, "users")
    return user


async def list_users(
    session: AsyncSession, actor: Actor, tenant_id: uuid.UUID | None = None
) -> list[UserView]:
    """Users the actor may see, by email (optionally of one tenant)."""
    require(actor, "users")
    query = select(User).order_by(User.email)
    if actor.tenant_id is not None:
        query = query.where(User.tenant_id == actor.tenant_id)
    if tenant_id is not None:
        query = query.where(User.tenant_id == tenant_id)
    return [user_view(u) for u in await session.scalars(query)]


async def change_role(
    session: AsyncSession, actor: Actor, user_id: uuid.UUID, data: UserUpdate
) -> UserView:
    """Change a user's role (within the roles the actor may grant)."""
    user = await get_user(session, actor, user_id)
    require(actor, "users", write=True)
    role = Role(data.role)
    grantable(actor, role)
    grantable(actor, Role(user.role))
    if role not in GLOBAL_ROLES and user.tenant_id is None:
        raise BadRequest(f"A {role} user needs a tenant; this user has none.", param="role")
    before = snapshot(user, *FIELDS)
    user.role = role
    if role is Role.PLATFORM_ADMIN:
        user.tenant_id = None
    await session.flush()
    await record(session, actor, "user.role_change", "user", user.id, user.tenant_id,
                 before=before, after=snapshot(user, *FIELDS))  # fmt: skip
    return user_view(user)


async def delete_user(session: AsyncSession, actor: Actor, user_id: uuid.UUID) -> None:
    """Delete a user."""
    user = await get_user(session, actor, user_id)
    require(actor, "users", write=True)
    grantable(actor, Role(user.role))
    before = snapshot(user, *FIELDS)
    await session.delete(user)
    await session.flush()
    await record(session, actor, "user.delete", "user", user_id, user.tenant_id, before=before)


async def authenticate(
    sessions: async_sessionmaker[AsyncSession], email: str, password: str,
    request_id: str | None, source: str | None,
) -> User:  # fmt: skip
    """Check a password (constant work whether or not the user exists); audit the login.

    The hash runs in a thread while no database connection is held: a sign-in flood neither
    stalls the event loop nor takes the pool's connections from other requests."""
    async with sessions() as session:
        found = await session.scalar(select(User).where(User.email == email.lower()))
    if not await verify(found.password_hash if found else None, password) or found is None:
        raise Unauthorized("Incorrect email or password.")
    async with sessions.begin() as session:
        user = await session.get(User, found.id, with_for_update=True)
        if user is None or user.password_hash != found.password_hash:  # changed meanwhile
            raise Unauthorized("Incorrect email or password.")
        user.last_login_at = datetime.now(UTC)
        actor = Actor(f"user:{user.email}", Role(user.role), user.tenant_id,
                      request_id=request_id, source=source)  # fmt: skip
        await record(session, actor, "user.login", "user", user.id, user.tenant_id)
    return user


async def sign_in_verified(
    session: AsyncSession, identity: VerifiedIdentity, request_id: str | None,
    source: str | None, method: str,
) -> User:  # fmt: skip
    """Sign in the user an identity provider vouched for (audited like a password login).

    The first sign-in binds the user to the provider's ``(iss, sub)``; from then on that pair
    finds the user even after an email change at the provider, and a token with the user's
    email but another subject (someone who took over the address there) is refused."""
    bound = await session.scalar(
        select(User).where(User.oidc_issuer == identity.issuer,
                           User.oidc_subject == identity.subject)
    )  # fmt: skip
    user = bound or await session.scalar(select(User).where(User.email == identity.email.lower()))
    if user is None:
        raise Forbidden(f"No console account has the email {identity.email}; ask an administrator.")
    if bound is None:
        if user.oidc_subject is not None:
            raise Forbidden(
                "This console account is bound to another single sign-on identity; "
                "ask an administrator."
            )
        user.oidc_issuer, user.oidc_subject = identity.issuer, identity.subject
    user.last_login_at = datetime.now(UTC)
    await session.flush()
    actor = Actor(f"user:{user.email}", Role(user.role), user.tenant_id,
                  request_id=request_id, source=source)  # fmt: skip
    await record(session, actor, "user.login", "user", user.id, user.tenant_id,
                 after={"method": method})  # fmt: skip
    return user


async def signed_in_user(
    sessions: async_sessionmaker[AsyncSession], user_id: uuid.UUID, version: object
) -> User | None:
    """The user a console session names, if that session is still current (the user exists and
    its session version is the one the session was given)."""
    async with sessions() as session:
        user = await session.get(User, user_id)
    return user if user is not None and user.session_version == version else None


async def sign_out_everywhere(session: AsyncSession, user_id: uuid.UUID, version: int) -> None:
    """Sign out every console session of the user (their session version moves on), if
    ``version`` is still current (an already signed-out cookie changes nothing)."""
    await session.execute(
        update(User).where(User.id == user_id, User.session_version == version)
        .values(session_version=User.session_version + 1)
    )  # fmt: skip


def user_view(u: User) -> UserView:
    """Wire form of a user."""
    return UserView(
        id=u.id, email=u.email, role=u.role, tenant_id=u.tenant_id, created_at=u.created_at,
        last_login_at=u.last_login_at,
    )  # fmt: skip
