"""Alembic environment: runs on the connection Kiln hands over, or on the configured database."""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy.engine import Connection

from kiln_platform.batches import tables as _batch_tables  # noqa: F401  (registers them)
from kiln_platform.billing import tables as _billing_tables  # noqa: F401  (registers them)
from kiln_platform.db.tables import Base
from kiln_platform.gateway import chat_store as _chat_store  # noqa: F401  (registers it)
from kiln_platform.gateway import response_store as _response_store  # noqa: F401  (registers it)
from kiln_platform.registry import tables as _registry_tables  # noqa: F401  (registers them)
from kiln_platform.shadow import tables as _shadow_tables  # noqa: F401  (registers them)
from kiln_platform.slo import tables as _slo_tables  # noqa: F401  (registers them)
from kiln_platform.webhooks import tables as _webhook_tables  # noqa: F401  (registers them)

target_metadata = Base.metadata


def _run(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=target_metadata, compare_type=True)
    with context.begin_transaction():
        context.run_migrations()


async def _run_from_settings() -> None:
    from kiln_platform.db.engine import create_engine, database_urls
    from kiln_platform.settings import Settings

    settings = Settings()
    context.config.attributes.setdefault("secret", settings.hmac_key())
    with database_urls(settings) as urls:
        engine = create_engine(urls.owner, pool_size=1)
        async with engine.connect() as conn:
            await conn.run_sync(_run)
            await conn.commit()
        await engine.dispose()


connection = context.config.attributes.get("connection")
if connection is not None:
    _run(connection)
else:
    asyncio.run(_run_from_settings())
