"""Platform test helpers: the module's database opened, and the real app served in-process."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from litestar import Litestar

from kiln_platform.context import Kiln
from kiln_platform.db.database import Database, open_database
from kiln_platform.registry.services import register_version
from kiln_platform.settings import Settings
from kiln_runtimes.lora import Dims
from kiln_runtimes.protocol import ModelManifest


@pytest.fixture(scope="module")
async def db(
    database_uri: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Database]:
    """The module's fresh database, opened (engine and session factory), no app."""
    settings = Settings(data_dir=tmp_path_factory.mktemp("data"), database_url=database_uri)
    async with open_database(settings) as database:
        yield database


@asynccontextmanager
async def serving(app: Litestar) -> AsyncIterator[None]:
    """Run the app's lifespan (entered and left in one task, as a server would) around a block."""
    started, stop = asyncio.Event(), asyncio.Event()

    async def serve() -> None:
        async with app.lifespan():
            started.set()
            await stop.wait()

    task = asyncio.create_task(serve())
    await started.wait()
    try:
        yield
    finally:
        stop.set()
        await task


TINY_LLM_DECODER = {"head_size": 4, "hidden_size": 8, "num_attention_heads": 2,
                    "num_key_value_heads": 1, "num_hidden_layers": 2}  # fmt: skip
TINY_LLM_DIMS = Dims(num_layers=2, hidden=8, q_size=8, kv_size=4)
"""Attention shapes of ``register_tiny_llm``'s model."""


async def register_tiny_llm(kiln: Kiln, folder: Path, name: str = "tiny-llm") -> str:
    """A generation model whose artifact is only the ``genai_config.json`` adapters are read
    against (no worker can serve it: keep ``pool_initial_replicas=0``)."""
    (folder / "genai_config.json").write_text(json.dumps({"model": {"decoder": TINY_LLM_DECODER}}))
    digest = kiln.store.put_dir(folder)
    manifest = ModelManifest(name=name, task="generate", engine="onnxruntime-genai")
    async with kiln.db.sessions.begin() as session:
        await register_version(session, manifest, "1", digest)
    return name
