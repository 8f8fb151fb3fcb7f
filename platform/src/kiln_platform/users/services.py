"""Console users: local accounts with argon2 hashes and one role each."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from kiln_platform.admin.authz import GLOBAL_ROLES, Actor, Role, check_tenant, grantable, require
from kiln_platform.admin.services import get_tenant
from kiln_platform.audit.services import record, snapshot
from kiln_platform.db.tables import User
from kiln_platform.errors import BadRequest, Conflict, Forbidden, NotFound, Unauthorized
from kiln_platform.users.schemas import UserCreate, UserUpdate, UserView

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

FIELDS = ("id", "email", "role", "tenant_id")
_hasher = PasswordHasher()
_DUMMY = _hasher.hash("kiln-timing-equalizer")


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
        email=data.email.lower(), password_hash=_hasher.hash(data.password), role=role,
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
    session: AsyncSession, email: str, password: str, request_id: str | None, source: str | None
) -> User:
    """Check a password (constant work whether or not the user exists); audit the login."""
    user = await session.scalar(select(User).where(User.email == email.lower()))
    try:
        _hasher.verify(user.password_hash if user else _DUMMY, password)
        ok = user is not None
    except (VerificationError, InvalidHashError):
        ok = False
    if not ok or user is None:
        raise Unauthorized("Incorrect email or password.")
    user.last_login_at = datetime.now(UTC)
    actor = Actor(f"user:{user.email}", Role(user.role), user.tenant_id,
                  request_id=request_id, source=source)  # fmt: skip
    await record(session, actor, "user.login", "user", user.id, user.tenant_id)
    return user


async def sign_in_verified(
    session: AsyncSession, email: str, request_id: str | None, source: str | None, method: str
) -> User:
    """Sign in a user whose email an identity provider verified (audited like a password login)."""
    user = await session.scalar(select(User).where(User.email == email.lower()))
    if user is None:
        raise Forbidden(f"No console account has the email {email}; ask an administrator.")
    user.last_login_at = datetime.now(UTC)
    actor = Actor(f"user:{user.email}", Role(user.role), user.tenant_id,
                  request_id=request_id, source=source)  # fmt: skip
    await record(session, actor, "user.login", "user", user.id, user.tenant_id,
                 after={"method": method})  # fmt: skip
    return user


def user_view(u: User) -> UserView:
    """Wire form of a user."""
    return UserView(
        id=u.id, email=u.email, role=u.role, tenant_id=u.tenant_id, created_at=u.created_at,
        last_login_at=u.last_login_at,
    )  # fmt: skip
