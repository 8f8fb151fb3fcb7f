"""The gateway's view of adapters: ``<base model>:<adapter>`` -> the adapter's digest, cached."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from sqlalchemy import select

from kiln_platform._ttlcache import TTLCache
from kiln_platform.db.tables import Adapter, Model

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

    from kiln_platform.settings import Settings

SEPARATOR = ":"


def split(model: str) -> tuple[str, str | None]:
    """``"base:adapter"`` -> ``("base", "adapter")``; a plain name has no adapter."""
    base, sep, adapter = model.partition(SEPARATOR)
    return base, adapter if sep else None


def slot_rank(settings: Settings, version_slots: int | None = None) -> int:
    """The columns of a worker's adapter slot, or 0 when workers hold no adapters (a version's
    own ``adapter_slots``, when set, over the deployment's)."""
    slots = settings.worker_adapter_slots if version_slots is None else version_slots
    return settings.worker_adapter_rank if slots > 0 else 0


class AdapterDirectory:
    """Finds a tenant's adapter of a model; a deleted one is gone within ``ttl`` seconds."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession], ttl: float) -> None:
        self._sessions = sessions
        self._cache: TTLCache[tuple[uuid.UUID, str, str], str | None] = TTLCache(ttl)

    async def digest(self, tenant_id: uuid.UUID, model: str, adapter: str) -> str | None:
        """The artifact digest of the tenant's adapter ``adapter`` of ``model``, or ``None``."""

        async def load() -> str | None:
            async with self._sessions() as session:
                found: str | None = await session.scalar(
                    select(Adapter.digest)
                    .join(Model, Model.id == Adapter.model_id)
                    .where(
                        Adapter.tenant_id == tenant_id,
                        Model.name == model,
                        Adapter.name == adapter,
                    )
                )
                return found

        return await self._cache.get((tenant_id, model, adapter), load)

    def forget(self, tenant_id: uuid.UUID, model: str, adapter: str) -> None:
        """Drop what this process cached for the name (after an upload or a delete here)."""
        self._cache.forget((tenant_id, model, adapter))

    async def names(self, tenant_id: uuid.UUID) -> list[tuple[str, str, int]]:
        """``(base model, adapter, created)`` of the tenant's adapters (for ``/v1/models``)."""
        async with self._sessions() as session:
            rows = await session.execute(
                select(Model.name, Adapter.name, Adapter.created_at)
                .join(Model, Model.id == Adapter.model_id)
                .where(Adapter.tenant_id == tenant_id)
                .order_by(Model.name, Adapter.name)
            )
            return [(base, name, int(created.timestamp())) for base, name, created in rows]
