"""Files and Batches through the official openai SDK against a real ``kiln up``: a chat and
an embeddings batch equal the same requests made online, a cancel mid-run, bad input refused
with the line or field named and nothing billed; last, issue 20's kill test: the gateway
SIGKILLed twice during a batch, which completes with each line recorded once."""

from __future__ import annotations

import asyncio
import collections
import io
import json
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import openai
import psutil
import pytest
from sqlalchemy import select

from kiln_platform.db.database import open_database
from kiln_platform.db.tables import UsageEvent
from kiln_platform.settings import Settings

from .conftest import MINILM, SMOLLM2, KilnProcess, restart_kiln

CHAT: Any = "/v1/chat/completions"
EMBED: Any = "/v1/embeddings"
RESPONSES: Any = "/v1/responses"
FINAL = {"completed", "failed", "expired", "cancelled"}
CONCURRENCY = 2
"""KILN_BATCH_CONCURRENCY of the module's gateway: lines one batch runs at a time."""
QUESTIONS = ["What is the capital of France?", "Name a colour.", "Say hello."]


@pytest.fixture(scope="module")
def kiln(both_models: Callable[..., AbstractContextManager[KilnProcess]]) -> Iterator[KilnProcess]:
    env = {"KILN_BATCH_POLL_S": "0.2", "KILN_BATCH_CONCURRENCY": str(CONCURRENCY),
           "KILN_BATCH_LEASE_S": "2"}  # a killed gateway's batch is taken over 2 s on  # fmt: skip
    with both_models(env) as kiln:
        kiln.env["TEST_TENANT_ID"] = kiln.cli("tenants", "create", "acme").strip()
        kiln.env["TEST_KEY"] = kiln.new_key("acme")
        kiln.cli("tenants", "create", "other")
        kiln.env["OTHER_KEY"] = kiln.new_key("other")
        kiln.wait_until_serving(MINILM)
        kiln.wait_until_serving(SMOLLM2, path="completions")
        yield kiln


@pytest.fixture(scope="module")
def client(kiln: KilnProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{kiln.base_url}/v1", api_key=kiln.key, max_retries=0)


def _lines(requests: list[tuple[str, dict[str, Any]]]) -> bytes:
    lines = [{"custom_id": f"r{i}", "method": "POST", "url": url, "body": body}
             for i, (url, body) in enumerate(requests)]  # fmt: skip
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def _jsonl(url: str, bodies: list[dict[str, Any]]) -> bytes:
    return _lines([(url, body) for body in bodies])


def _chat(question: str, max_tokens: int = 12) -> dict[str, Any]:
    return {"model": SMOLLM2, "temperature": 0, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": question}]}  # fmt: skip


def _submit(client: openai.OpenAI, data: bytes, endpoint: str) -> Any:
    uploaded = client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
    return client.batches.create(
        input_file_id=uploaded.id, endpoint=endpoint,  # type: ignore[arg-type]
        completion_window="24h", metadata={"job": "test"},
    )  # fmt: skip


def _finished(client: openai.OpenAI, batch_id: str, timeout: float = 90) -> Any:
    deadline = time.monotonic() + timeout
    while (batch := client.batches.retrieve(batch_id)).status not in FINAL:
        assert time.monotonic() < deadline, f"batch still {batch.status}"
        time.sleep(0.2)
    return batch


def _counts(batch: Any) -> Any:
    assert batch.request_counts is not None
    return batch.request_counts


def _output(client: openai.OpenAI, file_id: str | None) -> dict[str, Any]:
    assert file_id is not None
    text = client.files.content(file_id).text
    return {o["custom_id"]: o for o in map(json.loads, text.splitlines())}


def _ledger(kiln: KilnProcess, batch_id: str) -> list[tuple[str, int, int]]:
    """(request id, status, cost) of the batch's usage rows."""

    async def read() -> list[tuple[str, int, int]]:
        settings = Settings(data_dir=Path(kiln.env["KILN_DATA_DIR"]))
        async with open_database(settings, upgrade=False) as db, db.sessions() as s:
            prefix = batch_id + "_%"  # the lines' request ids: batch_<hex>_<line>
            rows = await s.execute(
                select(UsageEvent.request_id, UsageEvent.status, UsageEvent.cost_micros)
                .where(UsageEvent.request_id.like(prefix))
            )  # fmt: skip
            return [tuple(r) for r in rows]  # type: ignore[misc]

    return asyncio.run(read())


def test_chat_and_embeddings_batches_equal_the_same_requests_online(
    client: openai.OpenAI, kiln: KilnProcess
) -> None:
    chats = [_chat(q) for q in QUESTIONS]
    chats[2] |= {"n": 2, "logprobs": True}  # a line fans out like the online request
    chats[1] |= {"store": True, "metadata": {"line": "r1"}}  # and is kept like it
    texts = ["the first", "a second text", "and a third one"]
    embeds = [{"model": MINILM, "input": t} for t in texts]
    chat_data, embed_data = _jsonl(CHAT, chats), _jsonl(EMBED, embeds)
    chat_batch, embed_batch = _submit(client, chat_data, CHAT), _submit(client, embed_data, EMBED)
    assert chat_batch.status == "validating"
    assert chat_batch.request_counts.total == 3
    assert client.files.content(chat_batch.input_file_id).content == chat_data

    done = _finished(client, chat_batch.id)
    assert (done.status, done.error_file_id, done.metadata) == ("completed", None, {"job": "test"})
    assert (done.request_counts.completed, done.request_counts.failed) == (3, 0)
    assert None not in (done.in_progress_at, done.finalizing_at, done.completed_at)
    out = _output(client, done.output_file_id)
    for i, body in enumerate(chats):
        online = client.chat.completions.create(**body)
        response = out[f"r{i}"]["response"]
        assert response["status_code"] == 200
        got = response["body"]
        contents = [choice["message"]["content"] for choice in got["choices"]]
        assert contents == [choice.message.content for choice in online.choices]
        assert [c["logprobs"] is not None for c in got["choices"]] == [i == 2] * len(contents)
        assert got["usage"]["completion_tokens"] == online.usage.completion_tokens
    kept = client.chat.completions.retrieve(out["r1"]["response"]["body"]["id"])
    assert kept.model_dump()["metadata"] == {"line": "r1"}
    assert (
        kept.choices[0].message.content
        == out["r1"]["response"]["body"]["choices"][0]["message"]["content"]
    )
    ledger = _ledger(kiln, chat_batch.id)
    assert sorted(r for r, _, _ in ledger) == sorted(f"{chat_batch.id}_{n}" for n in (1, 2, 3))
    assert {status for _, status, _ in ledger} == {200}

    done = _finished(client, embed_batch.id)
    assert done.status == "completed"
    out = _output(client, done.output_file_id)
    online = client.embeddings.create(model=MINILM, input=texts, encoding_format="float")
    for i in range(3):
        vector = out[f"r{i}"]["response"]["body"]["data"][0]["embedding"]
        assert vector == pytest.approx(online.data[i].embedding, abs=1e-5)
    assert len(_ledger(kiln, embed_batch.id)) == 3

    listed = client.batches.list(limit=1)
    assert [b.id for b in listed.data] == [embed_batch.id]
    assert listed.has_more


def test_a_responses_batch_answers_as_the_online_responses(
    client: openai.OpenAI, kiln: KilnProcess
) -> None:
    bodies: list[dict[str, Any]] = [
        {"model": SMOLLM2, "input": q, "temperature": 0, "max_output_tokens": 12}
        for q in QUESTIONS[:2]
    ]
    batch = _submit(client, _jsonl(RESPONSES, bodies), RESPONSES)
    done = _finished(client, batch.id)
    assert (done.status, _counts(done).completed) == ("completed", 2)
    out = _output(client, done.output_file_id)
    for i, body in enumerate(bodies):
        online = client.responses.create(**body)
        got = out[f"r{i}"]["response"]["body"]
        assert got["object"] == "response"
        assert got["output"][0]["content"][0]["text"] == online.output_text
        assert online.usage is not None
        assert got["usage"]["output_tokens"] == online.usage.output_tokens
    assert {status for _, status, _ in _ledger(kiln, batch.id)} == {200}


def test_cancel_mid_run_stops_new_lines_and_keeps_finished_ones(
    client: openai.OpenAI, kiln: KilnProcess
) -> None:
    bodies = [_chat(f"Count to {n}.", max_tokens=24) for n in range(200)]  # cancelled long before
    batch = _submit(client, _jsonl(CHAT, bodies), CHAT)
    deadline = time.monotonic() + 60
    while _counts(client.batches.retrieve(batch.id)).completed < 2:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status == "cancelling"
    assert cancelling.cancelling_at is not None
    at_cancel = _counts(cancelling).completed
    done = _finished(client, batch.id)
    counts = _counts(done)
    assert (done.status, counts.total, counts.failed) == ("cancelled", 200, 0)
    # Only the lines in flight when the cancel landed finish (KILN_BATCH_CONCURRENCY of them).
    assert 2 <= at_cancel <= counts.completed <= at_cancel + CONCURRENCY
    assert done.cancelled_at is not None
    out = _output(client, done.output_file_id)
    assert len(out) == counts.completed
    assert len(_ledger(kiln, batch.id)) == counts.completed  # one row per finished line


def test_a_malformed_line_is_refused_on_upload_and_nothing_is_stored(
    client: openai.OpenAI,
) -> None:
    before = [f.id for f in client.files.list().data]
    data = _jsonl(EMBED, [{"model": MINILM, "input": "x"}]) + b'{"custom_id": oops}\n'
    with pytest.raises(openai.BadRequestError) as refused:
        client.files.create(file=("bad.jsonl", io.BytesIO(data)), purpose="batch")
    assert "Line 2: not a valid JSON object." in refused.value.message
    assert [f.id for f in client.files.list().data] == before


def test_bad_batches_name_the_field_or_line_and_bill_nothing(
    client: openai.OpenAI, kiln: KilnProcess
) -> None:
    good = client.files.create(file=("ok.jsonl", io.BytesIO(_jsonl(EMBED, [{"model": MINILM,
                               "input": "x"}]))), purpose="batch")  # fmt: skip
    unknown: Any = "/v1/images"
    with pytest.raises(openai.BadRequestError) as refused:
        client.batches.create(input_file_id=good.id, endpoint=unknown, completion_window="24h")
    assert refused.value.body["param"] == "endpoint"  # type: ignore[index]
    for metadata in ({"k" * 65: "v"}, {"k": "v" * 513}):  # OpenAI's bounds
        with pytest.raises(openai.BadRequestError) as refused:
            client.batches.create(input_file_id=good.id, endpoint=EMBED, completion_window="24h",
                                  metadata=metadata)  # fmt: skip
        assert refused.value.body["param"] == "metadata"  # type: ignore[index]
    other = openai.OpenAI(base_url=f"{kiln.base_url}/v1", api_key=kiln.env["OTHER_KEY"],
                          max_retries=0)  # fmt: skip
    with pytest.raises(openai.NotFoundError) as missing:
        other.batches.create(input_file_id=good.id, endpoint=EMBED, completion_window="24h")
    assert missing.value.body["param"] == "input_file_id"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError):
        other.files.retrieve(good.id)

    embed = {"model": MINILM, "input": "a"}
    cases = [  # (batch endpoint, lines, the line at fault, its field, the message says)
        (EMBED, [(EMBED, embed), (CHAT, _chat("hi"))], 2, "url", "'url' is '/v1/chat/comp"),
        (EMBED, [(EMBED, embed), (EMBED, {**embed, "model": "no-such"})], 2, "body.model",
         "every line of a batch names the same model"),
        (CHAT, [(CHAT, {**_chat("hi"), "model": "no-such"})], 1, "body.model",
         "`no-such` does not exist"),
        (CHAT, [(CHAT, {**_chat("hi"), "model": MINILM})], 1, "body.model",
         "does not serve /v1/chat/completions"),
    ]  # fmt: skip
    for endpoint, lines, line, param, words in cases:
        batch = _finished(client, _submit(client, _lines(lines), endpoint).id)
        assert batch.status == "failed", words
        error = batch.errors.data[0]
        assert (error.line, error.param) == (line, param)
        assert words in error.message
        assert batch.output_file_id is None
        assert batch.failed_at is not None
        assert _ledger(kiln, batch.id) == []


KILL_LINES = 30
KILL_INPUTS = [f"text {i} " + "of a batch line that a killed gateway ran " * 10 for i in range(4)]
"""Each line's inputs: enough for a line to take a while, so that a kill finds lines running."""


def _wait_done(client: openai.OpenAI, batch_id: str, at_least: int) -> int:
    """Poll until ``at_least`` lines are recorded; how many were when it saw that."""
    deadline = time.monotonic() + 40
    while (done := int(_counts(client.batches.retrieve(batch_id)).completed)) < at_least:
        assert time.monotonic() < deadline, f"{done} lines done, waiting for {at_least}"
        time.sleep(0.05)
    return done


def _kill_and_restart(kiln: KilnProcess) -> None:
    """SIGKILL ``kiln up`` (its lines in flight die unrecorded) and its orphaned workers, then
    start it again on the same data directory: ``kiln`` is the new one from then on."""
    workers = kiln.workers()
    kiln.proc.send_signal(signal.SIGKILL)
    kiln.proc.wait(timeout=10)
    for worker in workers:
        if worker.is_running():
            worker.kill()
    psutil.wait_procs(workers, timeout=10)
    again = restart_kiln(kiln)
    kiln.proc, kiln.base_url = again.proc, again.base_url
    kiln.wait_ready()


def _custom_ids(client: openai.OpenAI, *file_ids: str | None) -> list[str]:
    text = "".join(client.files.content(f).text for f in file_ids if f is not None)
    return [json.loads(line)["custom_id"] for line in text.splitlines()]


def test_a_batch_survives_two_gateway_kills_and_records_each_line_once(kiln: KilnProcess) -> None:
    """Last in the module: it replaces the module's ``kiln up`` (and its ``client``'s address)."""
    data = _jsonl(EMBED, [{"model": MINILM, "input": KILL_INPUTS} for _ in range(KILL_LINES)])
    client = openai.OpenAI(base_url=f"{kiln.base_url}/v1", api_key=kiln.key, max_retries=0)
    batch_id, seen = _submit(client, data, EMBED).id, 0
    kiln.env["KILN_POOL_INITIAL_REPLICAS"] = "0"  # restarts load MiniLM for the lines, no LLM
    for _ in range(2):
        seen = _wait_done(client, batch_id, seen + 4)
        assert seen < KILL_LINES - 4, "the batch ran too fast to be killed mid-run"
        _kill_and_restart(kiln)
        client = openai.OpenAI(base_url=f"{kiln.base_url}/v1", api_key=kiln.key, max_retries=0)
    done = _finished(client, batch_id, timeout=60)
    counts = _counts(done)
    assert (done.status, counts.total, counts.completed, counts.failed) == (
        "completed", KILL_LINES, KILL_LINES, 0,
    )  # fmt: skip
    ids = _custom_ids(client, done.output_file_id, done.error_file_id)
    assert [i for i, n in collections.Counter(ids).items() if n > 1] == []
    assert sorted(ids) == sorted(f"r{i}" for i in range(KILL_LINES))
    rows = sorted(r for r, _, _ in _ledger(kiln, batch_id))
    assert rows == sorted(f"{batch_id}_{n}" for n in range(1, KILL_LINES + 1))
