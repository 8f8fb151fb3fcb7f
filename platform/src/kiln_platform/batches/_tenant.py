"""A transaction confined to one tenant (row-level security's second wall)."""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from kiln_platform.db.engine import tenant_transaction

if TYPE_CHECKING:
    import uuid
    from collections.abc import AsyncIterator

    from sqlalchemy.ext.asyncio import AsyncSession

    from kiln_platform.context import Kiln


@asynccontextmanager
async def tenant_tx(kiln: Kiln, tenant_id: uuid.UUID) -> AsyncIterator[AsyncSession]:
    """A transaction as ``kiln_tenant`` with ``kiln.tenant_id`` set: it sees and writes only the
    tenant's rows, even from a query that forgot its filter."""
    async with tenant_transaction(kiln.db.sessions, tenant_id) as session:
        yield session
