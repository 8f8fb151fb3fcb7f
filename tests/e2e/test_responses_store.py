"""Stored responses through the openai SDK against a real ``kiln up``: ``store: true`` keeps a
response, ``previous_response_id`` goes on from it exactly as sending the history would, and it
can be read back (its input items too) and deleted."""

from __future__ import annotations

from typing import Any

import openai
import pytest

MODEL = "smollm2-135m-instruct"
FIRST = "Name a colour."
SECOND = "Now name a fruit."


@pytest.fixture(scope="module")
def client(llm_up: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{llm_up.base_url}/v1", api_key=llm_up.key, max_retries=0)


def _ask(client: openai.OpenAI, **fields: Any) -> Any:
    return client.responses.create(model=MODEL, temperature=0, max_output_tokens=12, **fields)


def test_a_stored_response_is_gone_on_from_as_its_history(client: openai.OpenAI) -> None:
    first = _ask(client, input=FIRST, instructions="Be brief.", store=True)
    assert first.store is True
    kept = client.responses.retrieve(first.id)
    assert (kept.id, kept.output_text, kept.usage) == (first.id, first.output_text, first.usage)
    then = _ask(client, input=SECOND, previous_response_id=first.id, store=True)
    assert then.previous_response_id == first.id
    history: Any = [{"role": "user", "content": FIRST},
                    *[o.model_dump(exclude_none=True) for o in first.output],
                    {"role": "user", "content": SECOND}]  # fmt: skip
    sent = _ask(client, input=history)  # stateless, and without the first's instructions
    assert sent.store is False
    assert then.output_text == sent.output_text
    assert then.usage is not None
    assert sent.usage is not None
    assert then.usage.input_tokens == sent.usage.input_tokens
    third = _ask(client, input="And a animal.", previous_response_id=then.id)
    assert third.usage is not None
    assert third.usage.input_tokens > then.usage.input_tokens + then.usage.output_tokens
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(third.id)  # not stored: store was absent
    items = client.responses.input_items.list(then.id, order="asc")
    said = [(i.type, getattr(i, "role", None)) for i in items.data]
    assert said == [("message", "user"), ("message", "assistant"), ("message", "user")]


def test_a_streamed_response_is_stored_before_its_last_event(client: openai.OpenAI) -> None:
    events = list(_ask(client, input=FIRST, store=True, stream=True))
    last: Any = events[-1]
    assert last.type in ("response.completed", "response.incomplete")  # the last, either way
    kept = client.responses.retrieve(last.response.id)
    assert kept.output_text == last.response.output_text


def test_deleted_or_unknown_responses_are_not_found(client: openai.OpenAI) -> None:
    first = _ask(client, input=FIRST, store=True)
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError) as missing:
        _ask(client, input=SECOND, previous_response_id=first.id)
    assert "previous_response_id" in str(missing.value)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(first.id)
