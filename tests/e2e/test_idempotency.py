"""Idempotency-Key against a real ``kiln up`` (all-MiniLM-L6-v2 and SmolLM2 served), through the
official ``openai`` SDK: replays are identical, flagged and never billed again; a running
duplicate is 409, a changed body 422; streams replay as sent; a cut stream runs again; admin
POSTs replay."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from sqlalchemy import func, select

from kiln_platform.db.database import open_database
from kiln_platform.db.tables import UsageEvent
from kiln_platform.settings import Settings

from .conftest import MINILM, SMOLLM2, KilnProcess

LONG = [{"role": "user", "content": "Tell me a very long story about dragons and castles."}]


@pytest.fixture(scope="module")
def kiln(both_models: Callable[..., AbstractContextManager[KilnProcess]]) -> Iterator[KilnProcess]:
    with both_models() as kiln:
        kiln.cli("tenants", "create", "acme")
        made = kiln.cli("keys", "create", "--tenant", "acme", "--scope", "inference",
                        "--scope", "admin:write", "--role", "platform-admin")  # fmt: skip
        kiln.env["TEST_KEY"] = made.strip().splitlines()[-1]
        kiln.wait_until_serving(MINILM)
        kiln.wait_until_serving(SMOLLM2, path="completions")
        yield kiln


def _client(kiln: KilnProcess, retries: int = 0) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{kiln.base_url}/v1", api_key=kiln.key, max_retries=retries)


def _events(kiln: KilnProcess, *request_ids: str) -> int:
    """Usage events in the ledger, of these requests (or all)."""

    async def count() -> int:
        async with (
            open_database(Settings(data_dir=Path(kiln.env["KILN_DATA_DIR"])), upgrade=False) as db,
            db.sessions() as s,
        ):
            query = select(func.count()).select_from(UsageEvent)
            if request_ids:
                query = query.where(UsageEvent.request_id.in_(request_ids))
            return int(await s.scalar(query) or 0)

    return asyncio.run(count())


def _settled(kiln: KilnProcess, expected: int, *request_ids: str) -> int:
    """Wait for the ledger's batched writer (0.2 s) to reach ``expected`` rows, then read."""
    deadline = time.monotonic() + 10
    while _events(kiln, *request_ids) < expected and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1.0)  # and give an extra, wrong row time to show up
    return _events(kiln, *request_ids)


def test_embeddings_replay_is_identical_and_not_billed(kiln: KilnProcess) -> None:
    client, key = _client(kiln), f"emb-{uuid.uuid4()}"
    before = _events(kiln)
    create = client.embeddings.with_raw_response.create
    first = create(model=MINILM, input=["a cat sits"], extra_headers={"Idempotency-Key": key})
    request_id = first.headers["x-request-id"]
    assert _settled(kiln, before + 1) == before + 1
    again = create(model=MINILM, input=["a cat sits"], extra_headers={"Idempotency-Key": key})
    assert again.headers["idempotent-replayed"] == "true"
    assert "idempotent-replayed" not in first.headers
    assert again.http_response.content == first.http_response.content
    assert again.headers["x-request-id"] == request_id
    assert again.parse().data[0].embedding == first.parse().data[0].embedding
    assert _settled(kiln, before + 1) == before + 1  # no new ledger row
    assert _events(kiln, request_id) == 1
    changed = client.embeddings.with_raw_response.create
    with pytest.raises(openai.UnprocessableEntityError) as reused:
        changed(model=MINILM, input=["a dog sits"], extra_headers={"Idempotency-Key": key})
    assert reused.value.status_code == 422
    assert reused.value.body["param"] == "Idempotency-Key"  # type: ignore[index]
    assert _settled(kiln, before + 1) == before + 1


def _stream_text(kiln: KilnProcess, key: str) -> tuple[str, dict[str, str]]:
    raw = _client(kiln).chat.completions.with_raw_response.create(
        model=SMOLLM2, messages=[{"role": "user", "content": "Name three colours."}],
        max_tokens=24, stream=True, seed=7, extra_headers={"Idempotency-Key": key},
    )  # fmt: skip
    text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
    return text, dict(raw.headers)


def test_streamed_chat_replays_the_same_content(kiln: KilnProcess) -> None:
    key = f"chat-{uuid.uuid4()}"
    text, headers = _stream_text(kiln, key)
    replay, replay_headers = _stream_text(kiln, key)
    assert text
    assert replay == text
    assert replay_headers["idempotent-replayed"] == "true"
    assert replay_headers["content-type"].startswith("text/event-stream")
    assert replay_headers["x-request-id"] == headers["x-request-id"]
    assert _settled(kiln, 1, headers["x-request-id"]) == 1


def test_running_duplicate_is_409_then_replays(kiln: KilnProcess) -> None:
    key = f"long-{uuid.uuid4()}"
    body: dict[str, Any] = {"model": SMOLLM2, "messages": LONG, "max_tokens": 400, "stream": True}
    headers = {"Idempotency-Key": key}
    first = _client(kiln).chat.completions.with_raw_response.create(**body, extra_headers=headers)
    chunks = iter(first.parse())
    text = [c.choices[0].delta.content or "" for c in [next(chunks)] if c.choices]
    # The first request is running (its first chunk is here, the rest not read yet): a
    # duplicate now is refused, not run and not queued behind it.
    with pytest.raises(openai.ConflictError) as running:
        _client(kiln).chat.completions.create(**body, extra_headers=headers)
    assert running.value.response.headers["x-should-retry"] == "true"
    assert running.value.response.headers["retry-after"] == "1"
    assert running.value.body["code"] == "idempotency_key_in_use"  # type: ignore[index]
    text += [c.choices[0].delta.content or "" for c in chunks if c.choices]
    # once the first has finished, the same call (SDK retries on) gets the stored answer
    replay = _client(kiln, retries=2).chat.completions.with_raw_response.create(
        **body, extra_headers=headers
    )
    replayed = "".join(c.choices[0].delta.content or "" for c in replay.parse() if c.choices)
    assert replay.headers["idempotent-replayed"] == "true"
    assert replayed == "".join(text)
    assert _settled(kiln, 1, first.headers["x-request-id"]) == 1


def test_a_stream_cut_by_the_client_runs_again(kiln: KilnProcess) -> None:
    key = f"cut-{uuid.uuid4()}"
    body = {"model": SMOLLM2, "messages": LONG, "max_tokens": 300, "stream": True}
    headers = {"authorization": f"Bearer {kiln.key}", "idempotency-key": key}
    url = f"{kiln.base_url}/v1/chat/completions"
    with httpx.stream("POST", url, json=body, headers=headers, timeout=60) as cut:
        lines = cut.iter_lines()
        assert sum(1 for _ in zip(range(6), lines, strict=False)) == 6
    deadline = time.monotonic() + 10  # the gateway notices the disconnect on its next send
    while (again := httpx.post(url, json=body, headers=headers, timeout=120)).status_code == 409:
        assert time.monotonic() < deadline, "the cut stream's key was never released"
        time.sleep(0.2)
    assert again.status_code == 200
    assert "idempotent-replayed" not in again.headers  # it ran again, and is stored now
    assert again.text.rstrip().endswith("data: [DONE]")
    replay = httpx.post(url, json=body, headers=headers, timeout=60)
    assert replay.headers["idempotent-replayed"] == "true"
    assert replay.content == again.content


def test_admin_post_replays_the_created_key(kiln: KilnProcess) -> None:
    admin = {"authorization": f"Bearer {kiln.key}"}
    made = httpx.post(f"{kiln.base_url}/admin/v1/tenants", json={"name": "idem-e2e"},
                      headers={**admin, "idempotency-key": "tenant-1"})  # fmt: skip
    again = httpx.post(f"{kiln.base_url}/admin/v1/tenants", json={"name": "idem-e2e"},
                       headers={**admin, "idempotency-key": "tenant-1"})  # fmt: skip
    assert made.status_code == again.status_code == 201
    assert again.headers["idempotent-replayed"] == "true"
    assert again.json() == made.json()
    tenants = httpx.get(f"{kiln.base_url}/admin/v1/tenants", headers=admin).json()
    assert [t["name"] for t in tenants].count("idem-e2e") == 1
    keys = f"{kiln.base_url}/admin/v1/tenants/{made.json()['id']}/keys"
    first = httpx.post(keys, json={"name": "ci"}, headers={**admin, "idempotency-key": "key-1"})
    second = httpx.post(keys, json={"name": "ci"}, headers={**admin, "idempotency-key": "key-1"})
    assert second.json()["secret"] == first.json()["secret"]
    assert len(httpx.get(keys, headers=admin).json()) == 1
