"""Anthropic's Messages API (``/v1/messages``) through the official ``anthropic`` SDK, its key
in ``x-api-key``: the same model, prompt and sampling answer as the chat completion does,
whole and streamed; tools come back as ``tool_use`` blocks and take ``tool_result`` turns; the
token count is the chat's prompt; a block Kiln cannot take is a 400 in Anthropic's shape."""

from __future__ import annotations

import json
import time
from typing import Any

import anthropic
import openai
import pytest

pytestmark = pytest.mark.slow
MODEL = "smollm2-135m-instruct"
SYSTEM = "You answer in one short sentence."
ASK: Any = [{"role": "user", "content": "What is the capital of France?"}]
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"],
}


@pytest.fixture(scope="module")
def clients(llm_up: Any) -> tuple[Any, Any]:
    return (
        anthropic.Anthropic(base_url=llm_up.base_url, api_key=llm_up.key, max_retries=0),
        openai.OpenAI(base_url=f"{llm_up.base_url}/v1", api_key=llm_up.key, max_retries=0),
    )


def test_a_message_is_the_chat_completions_answer(
    clients: tuple[Any, Any],
) -> None:
    claude, client = clients
    asked: dict[str, Any] = {"model": MODEL, "max_tokens": 24}
    chat = client.chat.completions.create(
        messages=[{"role": "system", "content": SYSTEM}, *ASK], temperature=0, **asked
    )
    asked["extra_body"] = {"temperature": 0}  # the SDK's own fields have no sampling now
    message = claude.messages.create(system=SYSTEM, messages=ASK, **asked)
    (block,) = message.content
    assert (block.type, block.text) == ("text", chat.choices[0].message.content)
    finish = chat.choices[0].finish_reason
    assert message.stop_reason == {"stop": "end_turn", "length": "max_tokens"}[finish]
    usage = message.usage
    assert usage.input_tokens + (usage.cache_read_input_tokens or 0) == chat.usage.prompt_tokens
    assert usage.output_tokens == chat.usage.completion_tokens
    assert message.id.startswith("msg_")
    with claude.messages.stream(system=SYSTEM, messages=ASK, **asked) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == block.text
    assert [(b.type, b.text) for b in final.content] == [(block.type, block.text)]
    assert (final.stop_reason, final.usage.output_tokens) == (message.stop_reason,
                                                              usage.output_tokens)  # fmt: skip
    word = block.text.split()[2]
    cut = claude.messages.create(system=SYSTEM, messages=ASK, stop_sequences=[word], **asked)
    assert (cut.stop_reason, cut.stop_sequence) == ("stop_sequence", word)
    assert cut.content[0].text == block.text[: block.text.index(word)]
    counted = claude.messages.count_tokens(model=MODEL, system=SYSTEM, messages=ASK)
    assert counted.input_tokens == chat.usage.prompt_tokens
    schema = {"type": "object", "properties": {"capital": {"type": "string", "maxLength": 20}},
              "required": ["capital"], "additionalProperties": False}  # fmt: skip
    shaped = claude.messages.create(messages=ASK, model=MODEL, max_tokens=40,
                                    output_config={"format": {"type": "json_schema",
                                                              "schema": schema}})  # fmt: skip
    assert set(json.loads(shaped.content[0].text)) == {"capital"}


def test_tools_are_tool_use_blocks_and_take_results(
    clients: tuple[Any, Any],
) -> None:
    claude, client = clients
    tools: Any = [{"name": "get_weather", "description": "The weather in a city.",
                   "input_schema": WEATHER}]  # fmt: skip
    said: Any = [{"role": "user", "content": "What is the weather in Oslo?"}]
    asked: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": 80,
        "tools": tools,
        "extra_body": {"temperature": 0},
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
    }
    called = claude.messages.create(messages=said, **asked)
    assert called.stop_reason == "tool_use", called
    (use,) = [b for b in called.content if b.type == "tool_use"]
    assert use.name == "get_weather"
    assert set(use.input) == {"city", "unit"}
    with claude.messages.stream(messages=said, **asked) as stream:
        final = stream.get_final_message()
    assert [(b.name, b.input) for b in final.content if b.type == "tool_use"] == [
        (use.name, use.input)]  # fmt: skip
    history = [*said, {"role": "assistant", "content": [b.model_dump() for b in called.content]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                             "content": "Sunny, 21 C"}]}]  # fmt: skip
    answer = claude.messages.create(model=MODEL, max_tokens=24, tools=tools, messages=history,
                                    extra_body={"temperature": 0})  # fmt: skip
    call = {"id": use.id, "type": "function",
            "function": {"name": use.name, "arguments": json.dumps(use.input)}}  # fmt: skip
    chat = client.chat.completions.create(
        model=MODEL, max_tokens=24, temperature=0, messages=[
            *said, {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": use.id, "content": "Sunny, 21 C"}],
        tools=[{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER,
                                                 "description": "The weather in a city."}}],
    )  # fmt: skip
    said_back = chat.choices[0].message  # the same turn as a chat: the same greedy answer
    assert [b.text for b in answer.content if b.type == "text"] == (
        [said_back.content] if said_back.content else [])  # fmt: skip
    assert [(b.name, b.input) for b in answer.content if b.type == "tool_use"] == [
        (c.function.name, json.loads(c.function.arguments))
        for c in said_back.tool_calls or []]  # fmt: skip


def test_a_block_kiln_cannot_take_is_a_400_in_anthropics_shape(
    clients: tuple[Any, Any],
) -> None:
    claude, _ = clients
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": "iVBORw0KGgo="}}  # fmt: skip
    bad: list[tuple[dict[str, Any], str]] = [
        ({"messages": [{"role": "user", "content": [image]}]}, "messages[0].content[0].type"),
        ({"messages": ASK, "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
         "tools[0].type"),
        ({"messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
    ]  # fmt: skip
    for fields, named in bad:
        with pytest.raises(anthropic.BadRequestError) as refused:
            claude.messages.create(model=MODEL, max_tokens=8, **fields)
        body = refused.value.body
        assert isinstance(body, dict)
        assert body["type"] == "error"
        assert body["error"]["type"] == "invalid_request_error"
        assert named in body["error"]["message"], json.dumps(body)
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=str(claude.base_url), api_key="nope",
                            max_retries=0).messages.create(model=MODEL, max_tokens=8,
                                                           messages=ASK)  # fmt: skip


def test_the_sdks_models_calls_get_anthropics_shape(clients: tuple[Any, Any]) -> None:
    claude, client = clients
    listed = [m.id for m in client.models.list()]
    paged = claude.models.list(limit=1)  # one model here: paging is unit-tested (anthropic_models)
    assert [m.id for m in paged] == listed
    assert paged.has_more is (len(listed) > 1)
    model = claude.models.retrieve(MODEL)
    assert (model.type, model.id, model.display_name) == ("model", MODEL, MODEL)
    assert model.created_at.timestamp() == client.models.retrieve(MODEL).created
    with pytest.raises(anthropic.NotFoundError) as missing:
        claude.models.retrieve("no-such-model")
    assert isinstance(missing.value.body, dict)
    assert missing.value.body["type"] == "error"


def test_a_message_batch_answers_as_messages_do(clients: tuple[Any, Any]) -> None:
    """Anthropic's Message Batches through the SDK: a bad request refuses the batch whole
    (naming it, nothing stored); a good batch runs, counts its outcomes, and its results are
    the messages the same requests get online (greedy), or Anthropic's error object."""
    claude, _ = clients
    params: Any = {"model": MODEL, "max_tokens": 12, "messages": ASK, "temperature": 0}
    before = [b.id for b in claude.messages.batches.list()]
    with pytest.raises(anthropic.BadRequestError, match=r"requests\[1\]\.custom_id"):
        claude.messages.batches.create(requests=[{"custom_id": "a", "params": params},
                                                 {"custom_id": "a", "params": params}])  # fmt: skip
    with pytest.raises(anthropic.BadRequestError, match=r"requests\[0\]\.params\.stop_sequences"):
        claude.messages.batches.create(requests=[
            {"custom_id": "a", "params": {**params, "stop_sequences": list("abcde")}}])  # fmt: skip
    assert [b.id for b in claude.messages.batches.list()] == before
    other = {**params, "system": SYSTEM}
    batch = claude.messages.batches.create(requests=[
        {"custom_id": "plain", "params": params}, {"custom_id": "told", "params": other},
        {"custom_id": "too-long", "params": {**params, "max_tokens": 10**7}}])  # fmt: skip
    assert (batch.id[:9], batch.processing_status) == ("msgbatch_", "in_progress")
    assert batch.request_counts.processing == 3
    deadline = time.monotonic() + 120
    while (batch := claude.messages.batches.retrieve(batch.id)).processing_status != "ended":
        assert time.monotonic() < deadline, batch
        time.sleep(0.5)
    counts = batch.request_counts
    assert (counts.succeeded, counts.errored, counts.processing) == (2, 1, 0)
    assert batch.results_url.endswith(f"/v1/messages/batches/{batch.id}/results")
    results = {r.custom_id: r.result for r in claude.messages.batches.results(batch.id)}
    assert list(results) == ["plain", "told", "too-long"]
    for name, asked in (("plain", params), ("told", other)):
        online = claude.messages.create(**{k: v for k, v in asked.items() if k != "temperature"},
                                        extra_body={"temperature": 0})  # fmt: skip
        assert results[name].type == "succeeded"
        assert results[name].message.content[0].text == online.content[0].text
    assert results["too-long"].type == "errored"
    assert results["too-long"].error.error.type == "invalid_request_error"
    assert batch.id in [b.id for b in claude.messages.batches.list(limit=5)]
    assert claude.messages.batches.delete(batch.id).type == "message_batch_deleted"
    with pytest.raises(anthropic.NotFoundError):
        claude.messages.batches.retrieve(batch.id)


def test_a_canceled_message_batch_reports_what_never_ran(clients: tuple[Any, Any]) -> None:
    claude, _ = clients
    params: Any = {"model": MODEL, "max_tokens": 40, "messages": ASK}
    asked = [{"custom_id": f"r{i}", "params": params} for i in range(20)]  # ~10 s of work
    batch = claude.messages.batches.create(requests=asked)
    canceling = claude.messages.batches.cancel(batch.id)
    assert canceling.processing_status in ("canceling", "ended")
    assert canceling.cancel_initiated_at is not None
    deadline = time.monotonic() + 60
    while (batch := claude.messages.batches.retrieve(batch.id)).processing_status != "ended":
        assert time.monotonic() < deadline, batch
        time.sleep(0.2)
    counts = batch.request_counts
    assert counts.canceled > 0
    assert counts.succeeded + counts.canceled == len(asked)
    kinds = {r.custom_id: r.result.type for r in claude.messages.batches.results(batch.id)}
    assert sorted(kinds) == sorted(a["custom_id"] for a in asked)
    assert list(kinds.values()).count("canceled") == counts.canceled


def test_a_message_batch_for_an_unknown_model_ends_with_each_request_errored(
    clients: tuple[Any, Any],
) -> None:
    claude, _ = clients
    params: Any = {"model": "no-such-model", "max_tokens": 8, "messages": ASK}
    batch = claude.messages.batches.create(requests=[{"custom_id": "x", "params": params}])
    deadline = time.monotonic() + 60
    while (batch := claude.messages.batches.retrieve(batch.id)).processing_status != "ended":
        assert time.monotonic() < deadline, batch
        time.sleep(0.2)
    assert (batch.request_counts.errored, batch.request_counts.succeeded) == (1, 0)
    (result,) = claude.messages.batches.results(batch.id)
    assert result.result.type == "errored"
    assert "no-such-model" in result.result.error.error.message
