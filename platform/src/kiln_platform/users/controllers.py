"""`/admin/v1/users` and the console login: thin handlers, behaviour in ``users.services``."""

from __future__ import annotations

import uuid

from litestar import delete, get, patch, post

from kiln_platform.admin.deps import ActorDep, AdminController, SessionDep
from kiln_platform.users import services
from kiln_platform.users.schemas import UserCreate, UserUpdate, UserView


class UsersController(AdminController):
    """Console users and their roles."""

    opt = {"resource": "users"}  # noqa: RUF012 (admin.deps.authorize reads it)

    @get("/users")
    async def list_users(
        self, session: SessionDep, actor: ActorDep, tenant_id: uuid.UUID | None = None
    ) -> list[UserView]:
        """Users visible to the caller (optionally of one tenant)."""
        return await services.list_users(session, actor, tenant_id)

    @post("/users", status_code=201)
    async def create_user(self, session: SessionDep, actor: ActorDep, data: UserCreate) -> UserView:
        """Create a user with a role (tenant-admins grant tenant roles in their tenant only)."""
        return await services.create_user(session, actor, data)

    @get("/users/{user_id:uuid}")
    async def get_user(self, session: SessionDep, actor: ActorDep, user_id: uuid.UUID) -> UserView:
        """One user."""
        return services.user_view(await services.get_user(session, actor, user_id))

    @patch("/users/{user_id:uuid}")
    async def change_role(
        self, session: SessionDep, actor: ActorDep, user_id: uuid.UUID, data: UserUpdate
    ) -> UserView:
        """Change a user's role."""
        return await services.change_role(session, actor, user_id, data)

    @delete("/users/{user_id:uuid}")
    async def delete_user(self, session: SessionDep, actor: ActorDep, user_id: uuid.UUID) -> None:
        """Delete a user."""
        await services.delete_user(session, actor, user_id)
