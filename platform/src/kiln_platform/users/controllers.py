"""`/admin/v1/users` and the console login: thin handlers, behaviour in ``users.services``."""

from __future__ import annotations

import uuid

from litestar import delete, get, patch, post

from kiln_platform.admin.deps import AdminController, CallDep
from kiln_platform.users import services
from kiln_platform.users.schemas import UserCreate, UserUpdate, UserView


class UsersController(AdminController):
    """Console users and their roles."""

    opt = {"resource": "users"}  # noqa: RUF012 (admin.deps.authorize reads it)

    @get("/users")
    async def list_users(self, call: CallDep, tenant_id: uuid.UUID | None = None) -> list[UserView]:
        """Users visible to the caller (optionally of one tenant)."""
        return await services.list_users(await call.session(), call.actor, tenant_id)

    @post("/users", status_code=201)
    async def create_user(self, call: CallDep, data: UserCreate) -> UserView:
        """Create a user with a role (tenant-admins grant tenant roles in their tenant only)."""
        return await services.create_user(await call.session(), call.actor, data)

    @get("/users/{user_id:uuid}")
    async def get_user(self, call: CallDep, user_id: uuid.UUID) -> UserView:
        """One user."""
        return services.user_view(
            await services.get_user(await call.session(), call.actor, user_id)
        )

    @patch("/users/{user_id:uuid}")
    async def change_role(self, call: CallDep, user_id: uuid.UUID, data: UserUpdate) -> UserView:
        """Change a user's role."""
        return await services.change_role(await call.session(), call.actor, user_id, data)

    @delete("/users/{user_id:uuid}")
    async def delete_user(self, call: CallDep, user_id: uuid.UUID) -> None:
        """Delete a user."""
        await services.delete_user(await call.session(), call.actor, user_id)
