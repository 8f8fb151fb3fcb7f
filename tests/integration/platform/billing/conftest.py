"""Billing fixtures: a migrated database of this module's own, without the app."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from kiln_platform.context import Database, open_database
from kiln_platform.settings import Settings


@pytest.fixture(scope="module")
async def db(
    database_uri: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Database]:
    """Sessions on a fresh, migrated database."""
    settings = Settings(data_dir=tmp_path_factory.mktemp("data"), database_url=database_uri)
    async with open_database(settings) as database:
        yield database
