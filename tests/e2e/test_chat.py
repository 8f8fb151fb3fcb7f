"""Chat and text completions through the official openai SDK against a real ``kiln up``."""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import jinja2
import openai
import pytest
from openai.types.chat import ChatCompletionChunk, ChatCompletionMessageParam
from openai.types.responses import ResponseFunctionToolCall
from sqlalchemy import select
from tokenizers import Tokenizer

from kiln_platform.db.database import open_database
from kiln_platform.db.tables import UsageEvent
from kiln_platform.settings import Settings
from tests.e2e.conftest import wait_for

MODEL = "smollm2-135m-instruct"
# The source model answers this one with a clear margin at every token (the bare question is a
# near-tie in the source itself: tests/integration/genai/test_genai_smollm2.py).
QUESTION = "What is the capital of France? Answer in one sentence."
PARIS = [{"role": "user", "content": QUESTION}]
PARIS_TYPED: list[ChatCompletionMessageParam] = [{"role": "user", "content": QUESTION}]


@pytest.fixture(scope="module")
def client(llm_up: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{llm_up.base_url}/v1", api_key=llm_up.key, max_retries=0)


def _chat(client: openai.OpenAI, **kwargs: Any) -> Any:
    return client.chat.completions.create(
        model=MODEL, messages=kwargs.pop("messages", PARIS), **kwargs
    )


def test_paris_deterministic_and_usage_matches_tokenizer(
    client: openai.OpenAI, smollm2_dir: Path
) -> None:
    first = _chat(client, temperature=0, max_tokens=40)
    second = _chat(client, temperature=0, max_tokens=40)
    text = first.choices[0].message.content
    assert "Paris" in text
    assert second.choices[0].message.content == text
    assert first.model == MODEL
    config = json.loads((smollm2_dir / "tokenizer_config.json").read_text())
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, autoescape=False)  # noqa: S701
    template = env.from_string(config["chat_template"])
    prompt = template.render(messages=PARIS, add_generation_prompt=True)
    tokenizer = Tokenizer.from_file(str(smollm2_dir / "tokenizer.json"))
    assert first.usage.prompt_tokens == len(tokenizer.encode(prompt, add_special_tokens=False).ids)
    assert 0 < first.usage.completion_tokens <= 40
    assert first.usage.total_tokens == first.usage.prompt_tokens + first.usage.completion_tokens
    if first.choices[0].finish_reason == "stop":
        assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False).ids) == text


@pytest.mark.parametrize("params", [{"temperature": 0}, {"temperature": 0.8, "seed": 1234}])
def test_stream_concatenation_equals_non_streamed(
    client: openai.OpenAI, params: dict[str, Any]
) -> None:
    full = _chat(client, max_tokens=48, **params)
    how: Any = {"include_usage": True, "include_obfuscation": False}  # the SDK's bandwidth saver
    stream = _chat(client, max_tokens=48, stream=True, stream_options=how, **params)
    chunks = list(stream)
    pieces = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert len([p for p in pieces if p]) > 3  # really incremental
    assert "".join(pieces) == full.choices[0].message.content
    finishes = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finishes == [full.choices[0].finish_reason]
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens


def test_raw_sse_has_data_lines_and_done(llm_up: Any) -> None:
    body = {"model": MODEL, "messages": PARIS, "max_tokens": 8, "stream": True}
    headers = {"authorization": f"Bearer {llm_up.key}"}
    with httpx.stream(
        "POST", f"{llm_up.base_url}/v1/chat/completions", json=body, headers=headers
    ) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines)
    assert lines[-1] == "data: [DONE]"
    assert json.loads(lines[0][6:])["object"] == "chat.completion.chunk"


def test_answers_say_which_version_served_them(client: openai.OpenAI) -> None:
    """``model`` is what was asked; the header and ``system_fingerprint`` name the version."""
    raw = client.chat.completions.with_raw_response.create(
        model=f"{MODEL}@test", messages=PARIS_TYPED, max_tokens=2
    )
    done = raw.parse()
    assert raw.headers["x-kiln-model-version"] == "test"
    assert done.model == f"{MODEL}@test"
    assert re.fullmatch(r"kiln-test-[0-9a-f]{12}", done.system_fingerprint or "")
    with client.chat.completions.with_streaming_response.create(
        model=MODEL, messages=PARIS_TYPED, max_tokens=2, stream=True
    ) as streamed:
        assert streamed.headers["x-kiln-model-version"] == "test"
        chunks: list[ChatCompletionChunk] = list(streamed.parse())
    assert {c.system_fingerprint for c in chunks} == {done.system_fingerprint}


def test_max_tokens_gives_length(client: openai.OpenAI) -> None:
    resp = _chat(client, max_tokens=5, temperature=0)
    assert resp.usage.completion_tokens == 5
    assert resp.choices[0].finish_reason == "length"
    resp = _chat(client, max_completion_tokens=3, temperature=0)
    assert resp.usage.completion_tokens == 3


def test_stop_string_ends_output_before_it(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "Describe the sea in two sentences."}]
    free = _chat(client, messages=messages, temperature=0, max_tokens=40).choices[0].message.content
    assert len(free) > 30, free
    stop = free[15:19]  # a string that spans tokens somewhere in the middle of the answer
    cut = _chat(client, messages=messages, temperature=0, max_tokens=40, stop=[stop])
    assert cut.choices[0].message.content == free[: free.index(stop)]
    assert cut.choices[0].finish_reason == "stop"
    streamed = _chat(
        client, messages=messages, temperature=0, max_tokens=40, stop=stop, stream=True
    )
    assert (
        "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
        == free[: free.index(stop)]
    )


def test_text_completions(client: openai.OpenAI) -> None:
    resp = client.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=6, temperature=0
    )
    assert resp.object == "text_completion"
    assert resp.usage is not None
    assert resp.usage.completion_tokens <= 6
    assert resp.choices[0].text
    streamed = client.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=6, temperature=0, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed if c.choices) == resp.choices[0].text


def test_sixteen_concurrent_streams_complete(llm_up: Any) -> None:
    async def one(i: int, client: openai.AsyncOpenAI) -> tuple[str, str | None]:
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"Write a sentence about the number {i}."}],
            max_tokens=24 + i,
            temperature=0,
            stream=True,
        )
        text, finish = "", None
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                finish = chunk.choices[0].finish_reason or finish
        return text, finish

    async def run() -> list[tuple[str, str | None]]:
        async with openai.AsyncOpenAI(
            base_url=f"{llm_up.base_url}/v1", api_key=llm_up.key, max_retries=0
        ) as c:
            return await asyncio.gather(*(one(i, c) for i in range(16)))

    results = asyncio.run(run())
    assert all(text and finish in ("stop", "length") for text, finish in results), results


def _worker_gauge(llm_up: Any, name: str) -> float:
    (worker,) = llm_up.workers()
    port = worker.cmdline()[worker.cmdline().index("--port") + 1]
    metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", headers=llm_up.worker_headers()).text
    return sum(float(line.split()[-1]) for line in metrics.splitlines() if line.startswith(name))


def test_disconnect_frees_slot_and_bills_partial_tokens(llm_up: Any) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell me a very long story about dragons."}],
        "max_tokens": 2000,
        "stream": True,
    }
    headers = {"authorization": f"Bearer {llm_up.key}"}
    with httpx.stream(
        "POST", f"{llm_up.base_url}/v1/chat/completions", json=body, headers=headers
    ) as r:
        request_id = r.headers["x-request-id"]
        lines = r.iter_lines()
        got = [next(lines) for _ in range(8) if True]  # role chunk + content chunks
        assert sum(1 for line in got if line.startswith("data: ")) >= 3
        assert _worker_gauge(llm_up, "kiln_worker_running_sequences") >= 1
    closed = time.monotonic()
    while _worker_gauge(llm_up, "kiln_worker_running_sequences") > 0:
        assert time.monotonic() - closed < 1.0, "the sequence kept running after the client left"
        time.sleep(0.02)

    async def usage() -> Any:
        async with (
            open_database(Settings(data_dir=llm_up.env["KILN_DATA_DIR"])) as db,
            db.sessions() as s,
        ):
            return await s.scalar(select(UsageEvent).where(UsageEvent.request_id == request_id))

    deadline = time.monotonic() + 5
    while (event := asyncio.run(usage())) is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert event is not None
    assert event.status == 499
    assert 3 <= event.output_tokens < 2000


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"n": 20}, "n"),
        ({"best_of": 2}, "best_of"),
        (
            {"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "any"},
            "tool_choice",
        ),
        (
            {
                "tools": [{"type": "function", "function": {"name": "a b"}}],
                "tool_choice": "required",
            },
            "tools[0].function.name",
        ),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "x"}}}},
            "response_format.json_schema.schema",
        ),
        ({"frobnicate": 1}, "frobnicate"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages[0].content[0].type",
        ),
        ({"messages": [{"role": "user", "content": "hello " * 9000}]}, "messages"),
        ({"max_tokens": 9000}, "max_tokens"),
        ({"max_tokens": "5"}, "max_tokens"),  # a number in a string, as OpenAI's API refuses
        ({"temperature": "0.5"}, "temperature"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": 3}, "temperature"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"prompt_cache_retention": "forever"}, "prompt_cache_retention"),
        ({"metadata": {"k": 1}}, "metadata"),
        ({"store": "yes"}, "store"),
    ],
)
def test_bad_requests_are_400_naming_the_problem(
    llm_up: Any, extra: dict[str, Any], param: str
) -> None:
    body = {"model": MODEL, "messages": PARIS, **extra}
    r = httpx.post(
        f"{llm_up.base_url}/v1/chat/completions",
        json=body,
        headers={"authorization": f"Bearer {llm_up.key}"},
        timeout=30,
    )
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param, error
    assert param.split(".", maxsplit=1)[0].split("[", maxsplit=1)[0] in error["message"]


def test_over_long_prompt_message_has_both_numbers(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        _chat(client, messages=[{"role": "user", "content": "hello " * 9000}], max_tokens=10)
    message = err.value.body["message"]  # type: ignore[index]
    assert "8192" in message
    assert re.search(r"\d{4,} in the messages, 10 for the completion", message)


def test_a_repeated_long_prompt_reports_its_cached_prefix(client: openai.OpenAI) -> None:
    """The worker's prefix cache (128-token blocks, per tenant) serves the second request's
    first block: ``prompt_tokens_details.cached_tokens`` says so, streamed and not; the first
    request, its opening unique (a nonce), found nothing."""
    nonce = uuid.uuid4().hex
    text = f"{nonce}. " + " ".join(f"Item {i} is a small red box." for i in range(30))
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": text}]
    first = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
    second = client.chat.completions.create(  # OpenAI's cache hints change nothing here
        model=MODEL, messages=messages, max_tokens=2, prompt_cache_retention="24h",
        prompt_cache_options={"mode": "explicit", "ttl": "30m"},
    )  # fmt: skip
    streamed = list(client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=2, stream=True,
        stream_options={"include_usage": True},
    ))  # fmt: skip
    assert first.usage is not None
    assert second.usage is not None
    assert first.usage.prompt_tokens > 128
    assert first.usage.prompt_tokens_details is not None
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    for usage in (second.usage, streamed[-1].usage):
        assert usage is not None
        assert usage.prompt_tokens_details is not None
        cached = usage.prompt_tokens_details.cached_tokens
        assert cached is not None
        assert 128 <= cached < usage.prompt_tokens
        assert cached % 128 == 0


INSTRUCTIONS = "You answer in one short sentence."


def test_a_response_answers_as_the_chat_path_does(client: openai.OpenAI, llm_up: Any) -> None:
    """``/v1/responses`` is the chat path: the same answer and input tokens as a chat with
    ``instructions`` as its system message, recorded under its own endpoint."""
    raw = client.responses.with_raw_response.create(
        model=MODEL, instructions=INSTRUCTIONS, input=QUESTION, temperature=0,
        max_output_tokens=40,
    )  # fmt: skip
    done = raw.parse()
    chat = _chat(
        client, temperature=0, max_tokens=40,
        messages=[{"role": "system", "content": INSTRUCTIONS}, *PARIS],
    )  # fmt: skip
    assert (done.object, done.status, done.model) == ("response", "completed", MODEL)
    assert done.id.startswith("resp-")
    assert done.output_text == chat.choices[0].message.content
    assert "Paris" in done.output_text
    assert done.usage is not None
    assert done.usage.input_tokens == chat.usage.prompt_tokens
    assert done.usage.output_tokens == chat.usage.completion_tokens
    assert done.usage.total_tokens == done.usage.input_tokens + done.usage.output_tokens
    request_id = raw.headers["x-request-id"]
    rows = wait_for(lambda: llm_up.sql(
        "SELECT endpoint, output_tokens FROM usage_events WHERE request_id = :r", r=request_id
    ))  # fmt: skip
    assert [tuple(row) for row in rows] == [("responses", done.usage.output_tokens)]


def test_a_streamed_response_is_the_responses_event_sequence(client: openai.OpenAI) -> None:
    full = client.responses.create(model=MODEL, input=QUESTION, temperature=0, max_output_tokens=32)
    events = list(client.responses.create(
        model=MODEL, input=QUESTION, temperature=0, max_output_tokens=32, stream=True
    ))  # fmt: skip
    kinds = [e.type for e in events]
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert kinds == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added", *["response.output_text.delta"] * len(deltas),
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        f"response.{full.status}",
    ]  # fmt: skip
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert len(deltas) > 3
    assert "".join(deltas) == full.output_text
    last = events[-1].response  # type: ignore[union-attr]
    assert last.output_text == full.output_text
    assert last.usage is not None
    assert full.usage is not None
    assert last.usage.output_tokens == full.usage.output_tokens


def _text_part(response: Any) -> Any:
    return response.output[0].content[0]


def _scores(logprobs: Any) -> list[tuple[str, float, list[str]]]:
    return [(t.token, t.logprob, [a.token for a in t.top_logprobs or []]) for t in logprobs]


def test_a_response_carries_logprobs_when_included(client: openai.OpenAI) -> None:
    """``include: ["message.output_text.logprobs"]`` with ``top_logprobs``: the text's tokens,
    each with its alternatives, as chat's ``logprobs`` has them; streamed, spread over the
    deltas in order, and whole in the ``done`` event. Not asked, there are none."""
    asked: Any = {"model": MODEL, "input": QUESTION, "temperature": 0, "max_output_tokens": 12,
                  "include": ["message.output_text.logprobs"], "top_logprobs": 2}  # fmt: skip
    done = client.responses.create(**asked)
    chat = _chat(client, temperature=0, max_tokens=12, logprobs=True, top_logprobs=2)
    want = _scores(chat.choices[0].logprobs.content)
    got = _scores(_text_part(done).logprobs)
    assert [(t, tops) for t, _, tops in got] == [(t, tops) for t, _, tops in want]
    assert [lp for _, lp, _ in got] == pytest.approx([lp for _, lp, _ in want], abs=1e-3)
    assert done.usage is not None
    assert len(got) == done.usage.output_tokens == len(want) > 3
    assert all(len(tops) == 2 for _, _, tops in got)
    assert "".join(t for t, _, _ in got) == done.output_text
    events = list(client.responses.create(**asked, stream=True))
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert [t for e in deltas for t, _, _ in _scores(e.logprobs)] == [t for t, _, _ in want]
    assert sum(bool(e.logprobs) for e in deltas) > 1
    (text_done,) = [e for e in events if e.type == "response.output_text.done"]
    assert len(text_done.logprobs) == len(want)
    plain = client.responses.create(model=MODEL, input=QUESTION, temperature=0,
                                    max_output_tokens=4)  # fmt: skip
    assert _text_part(plain).logprobs == []


def test_truncation_auto_drops_the_oldest_turns_until_the_input_fits(
    client: openai.OpenAI,
) -> None:
    """A conversation longer than the context leaves (8192 tokens less ``max_output_tokens``)
    is a 400 as it stands; with ``truncation: auto`` its oldest whole turns go, the developer
    message first kept, and only as many as must: here the oldest alone, whose digits take a
    token every two characters (an estimate from the text's size dropped three turns)."""
    digits = " ".join(str(i * 7 % 10) for i in range(120))
    turns: list[Any] = [{"role": "user", "content": f"Note 0: {digits}"},
                        {"role": "assistant", "content": "Noted 0."}]  # fmt: skip
    for i in range(1, 6):
        turns += [{"role": "user", "content": f"Note {i}: " + "the sky is blue. " * 12},
                  {"role": "assistant", "content": f"Noted {i}."}]  # fmt: skip
    lead: Any = [{"role": "developer", "content": "Answer in one short sentence."}]

    def conversation(kept: int) -> Any:
        return [*lead, *turns[len(turns) - 2 * kept :], *PARIS]

    sizes = [
        client.responses.create(model=MODEL, input=conversation(k), max_output_tokens=1).usage
        for k in range(7)
    ]
    counts = [usage.input_tokens if usage else 0 for usage in sizes]
    assert counts == sorted(counts), counts  # each turn kept costs tokens
    room = 8192 - counts[5]  # the five newest turns fit; all six do not
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model=MODEL, input=conversation(6), max_output_tokens=room)
    assert "8192" in refused.value.message
    done = client.responses.create(model=MODEL, input=conversation(6), max_output_tokens=room,
                                   truncation="auto", temperature=0)  # fmt: skip
    assert (done.status, done.truncation) == ("completed", "auto")
    assert "Paris" in done.output_text
    assert done.usage is not None
    assert done.usage.input_tokens == counts[5], counts

    def long(turns: int) -> Any:
        return [*lead, *[{"role": "user", "content": "the sky is blue. " * 600}] * turns, *PARIS]

    count = client.responses.input_tokens.count
    whole, kept = (count(model=MODEL, input=long(n)).input_tokens for n in (3, 2))
    assert kept < 8192 < whole  # three long turns do not fit the context; two do
    cut = count(model=MODEL, input=long(3), truncation="auto")
    assert cut.input_tokens == kept  # counted as the response would send it


def test_a_conversation_goes_on_from_the_output_items(client: openai.OpenAI) -> None:
    """Kiln keeps no responses: the next turn sends the last one's output items back as input,
    and a cut answer is ``incomplete`` for ``max_output_tokens``."""
    turn: list[Any] = [{"role": "user", "content": QUESTION}]
    first = client.responses.create(model=MODEL, input=turn, temperature=0, max_output_tokens=40)
    turn += [item.model_dump(exclude_none=True) for item in first.output]
    turn.append({"role": "user", "content": [{"type": "input_text", "text": "And of Italy?"}]})
    second = client.responses.create(model=MODEL, input=turn, temperature=0, max_output_tokens=3)
    assert first.usage is not None
    assert second.usage is not None
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    assert (second.status, second.usage.output_tokens) == ("incomplete", 3)
    assert second.incomplete_details is not None
    assert second.incomplete_details.reason == "max_output_tokens"
    assert second.output[0].status == "incomplete"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"store": "yes"}, "store"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"tools": [{"type": "function", "name": "a b"}], "tool_choice": "required"},
         "tools[0].name"),
        ({"frobnicate": 1}, "frobnicate"),
        ({"input": ""}, "input"),
        ({"input": [{"type": "computer_call_output", "call_id": "c", "output": "x"}]},
         "input[0].type"),
        ({"input": [{"role": "wizard", "content": "hi"}]}, "input[0].role"),
        ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]},
         "input[0].content[0].type"),
        ({"input": "hello " * 9000}, "input"),
        ({"max_output_tokens": 9000}, "max_output_tokens"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"temperature": 3}, "temperature"),
        ({"text": {"format": {"type": "json_schema", "name": "p", "schema": {"type": "x"}}}},
         "text.format.schema"),
        ({"text": {"verbosity": "high"}}, "text"),
        ({"include": ["file_search_call.everything"]}, "include[0]"),
        ({"include": "message.output_text.logprobs"}, "include"),
        ({"top_logprobs": 21}, "top_logprobs"),
    ],
)  # fmt: skip
def test_bad_responses_are_400_naming_the_field(
    llm_up: Any, extra: dict[str, Any], param: str
) -> None:
    r = httpx.post(
        f"{llm_up.base_url}/v1/responses", json={"model": MODEL, "input": QUESTION, **extra},
        headers={"authorization": f"Bearer {llm_up.key}"}, timeout=30,
    )  # fmt: skip
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param, error
    assert param.split(".", maxsplit=1)[0].split("[", maxsplit=1)[0] in error["message"]


PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "likes_cats": {"type": "boolean"},
    },
    "required": ["name", "age", "likes_cats"],
    "additionalProperties": False,
}
ASK_PERSON = [{"role": "user", "content": "Describe a person as JSON."}]


def _person(text: str) -> None:
    value = json.loads(text)
    assert set(value) == {"name", "age", "likes_cats"}, value
    assert isinstance(value["name"], str)
    assert len(value["name"]) <= 12
    assert type(value["age"]) is int
    assert 0 <= value["age"] <= 120
    assert isinstance(value["likes_cats"], bool)


def test_a_json_schema_response_format_is_followed_when_sampling(client: openai.OpenAI) -> None:
    """Structured outputs: four sampled choices at temperature 1.2 (the free model writes prose
    and code fences) each parse and fit the schema, and end on their own."""
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    done = _chat(
        client, messages=ASK_PERSON, response_format=fmt, temperature=1.2, seed=5, n=4,
        max_tokens=60,
    )  # fmt: skip
    assert [c.finish_reason for c in done.choices] == ["stop"] * 4
    for choice in done.choices:
        _person(choice.message.content or "")
    greedy = _chat(client, messages=ASK_PERSON, response_format=fmt, temperature=0, max_tokens=60)
    streamed = _chat(
        client, messages=ASK_PERSON, response_format=fmt, temperature=0, max_tokens=60,
        stream=True,
    )  # fmt: skip
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert text == greedy.choices[0].message.content
    _person(text)
    anything = _chat(client, messages=ASK_PERSON, response_format={"type": "json_object"},
                     temperature=0, max_tokens=60)  # fmt: skip
    if anything.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(anything.choices[0].message.content or ""), dict)
    else:
        assert (anything.choices[0].message.content or "").startswith("{")


def test_a_response_text_format_is_a_json_schema_too(client: openai.OpenAI) -> None:
    fmt: Any = {"format": {"type": "json_schema", "name": "person", "schema": PERSON}}
    done = client.responses.create(
        model=MODEL, input=ASK_PERSON[0]["content"], text=fmt, temperature=1, max_output_tokens=60
    )
    assert done.status == "completed"
    _person(done.output_text)
    assert done.text is not None
    assert done.text.format is not None
    assert done.text.format.type == "json_schema"


def test_vllm_structured_outputs_choice_regex_and_grammar(client: openai.OpenAI) -> None:
    """vLLM's ``structured_outputs`` (and its older ``guided_*``) on chat and text completions."""
    asked = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Is the sky blue? Say yes or no."}],
        temperature=1.2, seed=3, n=4, max_tokens=10,
        extra_body={"structured_outputs": {"choice": ["yes", "no", "maybe not"]}},
    )  # fmt: skip
    assert [c.finish_reason for c in asked.choices] == ["stop"] * 4
    assert {c.message.content for c in asked.choices} <= {"yes", "no", "maybe not"}
    phone = client.completions.create(
        model=MODEL, prompt="My phone number is ", max_tokens=20, temperature=1, seed=1,
        extra_body={"guided_regex": r"\d{3}-\d{4}"},
    )  # fmt: skip
    assert re.fullmatch(r"\d{3}-\d{4}", phone.choices[0].text)
    assert phone.choices[0].finish_reason == "stop"
    fruit = client.completions.create(
        model=MODEL, prompt="Fruit: ", max_tokens=12, temperature=1, seed=2,
        extra_body={"structured_outputs": {"grammar": 'start: F (", " F)*\nF: "apple" | "plum"'}},
    )  # fmt: skip
    text = fruit.choices[0].text  # whole items, then (cut at max_tokens) part of the next one
    items = re.match(r"(?:apple|plum)(?:, (?:apple|plum))*", text)
    rest = text[items.end() :] if items else text
    assert any(way.startswith(rest) for way in (", apple", ", plum", "apple", "plum")), text
    if fruit.choices[0].finish_reason == "stop":
        assert rest == "", text


WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS: Any = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}},
]
ASK_WEATHER: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
OSLO: Any = {"name": "get_weather", "arguments": '{"city": "Oslo", "unit": "c"}'}
SHOWN_A_CALL: Any = [
    {"role": "user", "content": "What is the weather in Oslo?"},
    {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": OSLO}]},
    {"role": "tool", "tool_call_id": "c1", "content": "Sunny, 21 C"},
    {"role": "assistant", "content": "It is sunny in Oslo, 21 C."},
    *ASK_WEATHER,
]


def _weather(arguments: str) -> None:
    value = json.loads(arguments)
    assert set(value) == {"city", "unit"}
    assert isinstance(value["city"], str)
    assert len(value["city"]) <= 20
    assert value["unit"] in ("c", "f")


def test_tools_are_called_with_arguments_that_fit_their_schema(client: openai.OpenAI) -> None:
    """``tool_choice`` required and named: sampled calls parse and fit the function's
    ``parameters``; streamed, the calls come whole with the same finish reason; the calls and
    the tool's answer go back as history."""
    named: Any = {"type": "function", "function": {"name": "get_weather"}}
    chosen = _chat(client, messages=ASK_WEATHER, tools=TOOLS, tool_choice=named,
                   temperature=1.2, seed=4, n=3, max_tokens=40)  # fmt: skip
    for choice in chosen.choices:
        assert (choice.finish_reason, choice.message.content) == ("stop", None)
        (call,) = choice.message.tool_calls or []
        assert call.function.name == "get_weather"
        _weather(call.function.arguments)
    required = _chat(client, messages=ASK_WEATHER, tools=TOOLS, tool_choice="required",
                     parallel_tool_calls=False, temperature=0, max_tokens=60)  # fmt: skip
    message = required.choices[0].message
    assert required.choices[0].finish_reason == "tool_calls"
    (call,) = message.tool_calls or []
    assert call.function.name in ("get_weather", "get_time")
    assert isinstance(json.loads(call.function.arguments), dict)
    streamed = list(
        _chat(client, messages=ASK_WEATHER, tools=TOOLS, tool_choice="required",
              parallel_tool_calls=False, temperature=0, max_tokens=60, stream=True)
    )  # fmt: skip
    deltas = [d for c in streamed if c.choices for d in c.choices[0].delta.tool_calls or []]
    assert [(d.function.name, d.function.arguments) for d in deltas] == [
        (call.function.name, call.function.arguments)
    ]
    assert [c.choices[0].finish_reason for c in streamed if c.choices][-1] == "tool_calls"
    history = [*ASK_WEATHER, message.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id, "content": "18 C and sunny"}]  # fmt: skip
    answer = _chat(
        client, messages=history, tools=TOOLS, tool_choice="none", temperature=0, max_tokens=8
    )  # greedy: a sampled first token may end the answer at once
    assert answer.choices[0].message.content
    assert answer.usage.prompt_tokens > required.usage.prompt_tokens


def test_a_response_calls_a_function_and_takes_its_output(client: openai.OpenAI) -> None:
    """Function tools on ``/v1/responses``: a ``function_call`` item whose arguments fit the
    schema, the same items streamed, and the call with its output sent back as input."""
    tools: Any = [{"type": "function", "name": "get_weather", "parameters": WEATHER}]
    asked: Any = {"type": "function", "name": "get_weather"}
    done = client.responses.create(model=MODEL, input=ASK_WEATHER, tools=tools, tool_choice=asked,
                                   temperature=0, max_output_tokens=40)  # fmt: skip
    (call,) = done.output
    assert isinstance(call, ResponseFunctionToolCall)
    assert (done.status, call.type, call.name) == ("completed", "function_call", "get_weather")
    _weather(call.arguments)
    events = list(client.responses.create(
        model=MODEL, input=ASK_WEATHER, tools=tools, tool_choice=asked, temperature=0,
        max_output_tokens=40, stream=True,
    ))  # fmt: skip
    kinds = [e.type for e in events]
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.function_call_arguments.delta",
                     "response.function_call_arguments.done", "response.output_item.done",
                     "response.completed"]  # fmt: skip
    last: Any = events[-1]
    assert [(o.name, o.arguments) for o in last.response.output] == [(call.name, call.arguments)]
    history = [*ASK_WEATHER, call.model_dump(exclude_none=True),
               {"type": "function_call_output", "call_id": call.call_id,
                "output": "18 C and sunny"}]  # fmt: skip
    answer = client.responses.create(
        model=MODEL, input=history, temperature=0, max_output_tokens=8
    )  # greedy, as above
    assert answer.output_text
    assert answer.usage is not None
    assert done.usage is not None
    assert answer.usage.input_tokens > done.usage.input_tokens


def test_auto_tools_let_the_model_answer_in_text_or_call(
    client: openai.OpenAI, smollm2_dir: Path
) -> None:
    """``tools`` without ``tool_choice`` (the SDK's call, OpenAI's ``auto``): the model reads
    the tools (shown in a system message: more prompt tokens) and answers in text, streamed as
    it comes, even when it opens with ``<`` (``logit_bias``); shown a call in the history, it
    calls, and the call fits. With a ``response_format`` schema too, the answer is that
    schema's JSON or a call (``<`` opens only a call there)."""
    plain = _chat(client, messages=ASK_WEATHER, temperature=0, max_tokens=30)
    text = _chat(client, messages=ASK_WEATHER, tools=TOOLS, temperature=0, max_tokens=30)
    (choice,) = text.choices
    assert choice.message.tool_calls is None
    assert choice.message.content
    assert not choice.message.content.startswith("<")
    assert text.usage.prompt_tokens > plain.usage.prompt_tokens + 100
    chunks = list(_chat(client, messages=ASK_WEATHER, tools=TOOLS, temperature=0, max_tokens=30,
                        stream=True))  # fmt: skip
    pieces = [
        c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content
    ]
    assert len(pieces) > 1  # streamed as it came, not held
    assert "".join(pieces) == choice.message.content
    tokenizer = Tokenizer.from_file(str(smollm2_dir / "tokenizer.json"))
    push = {str(tokenizer.token_to_id("<")): 30}
    tagged = _chat(client, messages=ASK_WEATHER, tools=TOOLS, temperature=0, max_tokens=12,
                   logit_bias=push)  # fmt: skip
    assert tagged.choices[0].message.content.startswith("<")  # text, not a call cut short
    assert tagged.choices[0].message.tool_calls is None
    streamed = _chat(client, messages=ASK_WEATHER, tools=TOOLS, temperature=0, max_tokens=12,
                     logit_bias=push, stream=True)  # fmt: skip
    said = [c.choices[0].delta.content or "" for c in streamed if c.choices]
    assert "".join(said) == tagged.choices[0].message.content
    # cut while it may still be a call: its text, sent whole, logprobs and all
    cut = list(_chat(client, messages=SHOWN_A_CALL, tools=TOOLS, temperature=0, max_tokens=3,
                     logprobs=True, stream=True))  # fmt: skip
    held = [c.choices[0] for c in cut if c.choices and c.choices[0].delta.content]
    assert [h.delta.content for h in held] == ["<tool_"]
    assert [t.token for t in held[0].logprobs.content] == ["<", "tool", "_"]
    for stream in (False, True):
        called = _chat(client, messages=SHOWN_A_CALL, tools=TOOLS, temperature=0, max_tokens=80,
                       parallel_tool_calls=False, stream=stream)  # fmt: skip
        if stream:
            called = list(called)
            deltas = [d for c in called if c.choices for d in c.choices[0].delta.tool_calls or []]
            assert [c.choices[0].finish_reason for c in called if c.choices][-1] == "tool_calls"
            assert not any(c.choices[0].delta.content for c in called if c.choices)
            (call,) = deltas
        else:
            assert called.choices[0].finish_reason == "tool_calls"
            assert called.choices[0].message.content is None
            (call,) = called.choices[0].message.tool_calls or []
        assert call.function.name == "get_weather"
        _weather(call.function.arguments)
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    for bias, finish in ((-100, "stop"), (30, "tool_calls")):  # a person's JSON, or a call
        both = _chat(client, messages=ASK_PERSON, tools=TOOLS, response_format=fmt,
                     logit_bias={next(iter(push)): bias},
                     parallel_tool_calls=False, temperature=0, max_tokens=60)  # fmt: skip
        (choice,) = both.choices
        assert choice.finish_reason == finish
        if finish == "stop":
            _person(choice.message.content)
        else:
            (call,) = choice.message.tool_calls or []
            _weather(call.function.arguments)
    tools: Any = [{"type": "function", "name": "get_weather", "parameters": WEATHER}]
    done = client.responses.create(model=MODEL, input=ASK_WEATHER, tools=tools, temperature=0,
                                   max_output_tokens=30)  # fmt: skip
    assert [o.type for o in done.output] == ["message"]
    events: list[Any] = list(
        client.responses.create(model=MODEL, input=ASK_WEATHER, tools=tools, temperature=0,
                                max_output_tokens=30, stream=True)
    )  # fmt: skip
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]  # fmt: skip
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) > 1
    assert "".join(deltas) == done.output_text


def test_fields_recent_openai_clients_send_are_taken(client: openai.OpenAI) -> None:
    """``prompt_cache_key``, ``safety_identifier`` and ``verbosity: medium`` are accepted;
    ``top_p: 0`` (OpenAI takes it) is the most probable token alone, so a sampled answer
    equals the greedy one."""
    greedy = _chat(client, temperature=0, max_tokens=12)
    nucleus = _chat(client, temperature=1.5, top_p=0, max_tokens=12, prompt_cache_key="paris",
                    safety_identifier="user-7", verbosity="medium")  # fmt: skip
    assert nucleus.choices[0].message.content == greedy.choices[0].message.content
    with pytest.raises(openai.BadRequestError) as refused:
        _chat(client, max_tokens=4, verbosity="high")
    assert "verbosity" in str(refused.value)
