"""Stored responses through the openai SDK against a real ``kiln up``: ``store: true`` keeps a
response, ``previous_response_id`` goes on from it exactly as sending the history would, and it
can be read back (its input items too) and deleted. A background response answers at once,
``queued``, ends as the same request in the foreground would (billed once), and stops when
cancelled."""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING, Any

import httpx
import openai
import pytest
from playwright.sync_api import Page, expect

from .conftest import PASSWORD, axe_violations, settled, sign_in

if TYPE_CHECKING:
    from tests.e2e.conftest import KilnProcess

MODEL = "smollm2-135m-instruct"
FIRST = "Name a colour."
SECOND = "Now name a fruit."


LIVE = ("queued", "in_progress")
ADMIN = "boss@acme.test"
STORY = "Write a long story about a dragon and a knight."


@pytest.fixture(scope="module")
def kiln(llm_up: KilnProcess) -> KilnProcess:
    """The module's ``kiln up`` (the browser's ``page`` fixture takes it by this name)."""
    return llm_up


@pytest.fixture(scope="module")
def client(llm_up: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{llm_up.base_url}/v1", api_key=llm_up.key, max_retries=0)


def _ask(client: openai.OpenAI, **fields: Any) -> Any:
    return client.responses.create(model=MODEL, temperature=0, max_output_tokens=12, **fields)


def test_a_stored_response_is_gone_on_from_as_its_history(client: openai.OpenAI) -> None:
    first = _ask(client, input=FIRST, instructions="Be brief.", store=True,
                 prompt_cache_retention="in_memory")  # fmt: skip
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


def _ended(client: openai.OpenAI, response_id: str, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while (got := client.responses.retrieve(response_id)).status in LIVE:
        assert time.monotonic() < deadline, f"{response_id} still {got.status}"
        time.sleep(0.1)
    return got


def _billed(kiln: KilnProcess, response_id: str, timeout: float = 10) -> list[Any]:
    """The ledger's rows of a response (its request id is the response's), once there is one."""
    request_id, deadline = "req_" + response_id.removeprefix("resp-"), time.monotonic() + timeout
    query = "SELECT endpoint, status, output_tokens FROM usage_events WHERE request_id = :r"
    while not (rows := kiln.sql(query, r=request_id)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return rows


def test_a_background_response_answers_at_once_and_ends_as_in_the_foreground(
    client: openai.OpenAI, llm_up: KilnProcess
) -> None:
    started = _ask(client, input=FIRST, background=True)
    assert (started.status, started.background, started.store) == ("queued", True, True)
    assert started.output == []
    done = _ended(client, started.id)
    assert done.status in ("completed", "incomplete")
    assert done.background is True
    foreground = _ask(client, input=FIRST)
    assert done.output_text == foreground.output_text
    assert done.usage is not None
    assert _billed(llm_up, started.id) == [("responses", 200, done.usage.output_tokens)]
    with pytest.raises(openai.BadRequestError, match="stream"):
        client.responses.retrieve(started.id, stream=True)  # not an empty event stream
    stored = _ask(client, input=FIRST, store=True)
    with pytest.raises(openai.BadRequestError, match="background"):
        client.responses.cancel(stored.id)  # not run in background: nothing to cancel
    assert client.responses.cancel(started.id).status == done.status  # ended: as it is


def test_a_cancelled_background_response_stops_and_stays_cancelled(
    client: openai.OpenAI, llm_up: KilnProcess
) -> None:
    long = client.responses.create(model=MODEL, input=STORY, background=True,
                                   max_output_tokens=2000)  # fmt: skip
    with pytest.raises(openai.BadRequestError, match="still"):
        _ask(client, input=SECOND, previous_response_id=long.id)
    assert client.responses.cancel(long.id).status == "cancelled"
    ((endpoint, status, made),) = _billed(llm_up, long.id)  # written once the generation stops
    assert (endpoint, status) == ("responses", 499)  # stopped, not run to its end (200)
    assert made < 2000
    time.sleep(1)
    assert client.responses.retrieve(long.id).status == "cancelled"
    assert client.responses.cancel(long.id).status == "cancelled"


def test_a_streamed_background_response_resumes_where_its_client_left(
    client: openai.OpenAI, llm_up: KilnProcess
) -> None:
    """The client leaves mid-stream; the run goes on, and the stream resumes after the last
    event it saw (``starting_after``), live, then whole from the store once it ended."""
    events = _ask(client, input=STORY, background=True, stream=True)
    seen: list[Any] = []
    for event in events:
        seen.append(event)
        if event.type == "response.output_text.delta" and len(seen) >= 6:
            break
    events.close()  # the client leaves
    assert (seen[0].type, seen[0].response.status) == ("response.created", "queued")
    response_id = seen[0].response.id
    rest: list[Any] = list(client.responses.retrieve(
        response_id, stream=True, starting_after=seen[-1].sequence_number
    ))  # fmt: skip
    on = _ask(client, input=SECOND, previous_response_id=response_id)  # stored before its end
    assert on.status != "failed"
    assert [e.sequence_number for e in seen + rest] == list(range(len(seen) + len(rest)))
    final = rest[-1].response
    assert rest[-1].type == f"response.{final.status}"
    text = "".join(e.delta for e in seen + rest if e.type == "response.output_text.delta")
    assert text == final.output_text == _ask(client, input=STORY).output_text
    assert _ended(client, response_id).output_text == text
    again = list(client.responses.retrieve(response_id, stream=True))  # ended: from the store
    assert [e.model_dump() for e in again] == [e.model_dump() for e in seen + rest]
    assert final.usage is not None
    assert _billed(llm_up, response_id) == [("responses", 200, final.usage.output_tokens)]
    with pytest.raises(openai.BadRequestError, match="stream"):
        client.responses.retrieve(_ask(client, input=FIRST, store=True).id, stream=True)


def test_background_requests_that_cannot_run_fail_at_once(client: openai.OpenAI) -> None:
    cases: list[tuple[dict[str, Any], type[openai.APIStatusError], str]] = [
        ({"store": False}, openai.BadRequestError, "store"),
        ({"model": "no-such-model"}, openai.NotFoundError, "model"),
        ({"max_output_tokens": 10**6}, openai.BadRequestError, "max_output_tokens"),
    ]
    for fields, error, param in cases:
        with pytest.raises(error) as failed:
            client.responses.create(**{"model": MODEL, "input": FIRST, "background": True,
                                       **fields})  # fmt: skip
        assert failed.value.body["param"] == param  # type: ignore[index]
    with pytest.raises(openai.NotFoundError):
        client.responses.cancel("resp-nothing")


def _item(kind: str) -> Any:
    return {"type": kind}


def _role(role: str) -> Any:
    return {"type": "message", "role": role, "content": "x"}


def _user(text: str) -> Any:
    return {"type": "message", "role": "user", "content": text}


def test_a_conversation_is_the_history_responses_read_and_add_to(client: openai.OpenAI) -> None:
    """``conversation`` on a response reads its items as the history, exactly as sending them
    would, and adds the input and output to it (foreground, streamed and in background)."""
    conv = client.conversations.create(items=[_user(FIRST)], metadata={"topic": "demo"})
    assert (conv.object, conv.metadata) == ("conversation", {"topic": "demo"})
    first = _ask(client, input=SECOND, conversation=conv.id)
    assert first.conversation is not None
    assert first.conversation.id == conv.id
    assert first.output_text == _ask(client, input=[_user(FIRST), _user(SECOND)]).output_text
    items = client.conversations.items.list(conv.id, order="asc").data
    assert [(i.type, getattr(i, "role", None)) for i in items] == [
        ("message", "user"), ("message", "user"), ("message", "assistant"),
    ]  # fmt: skip
    said = {"type": "message", "role": "assistant", "content": first.output_text}
    third = [_user(FIRST), _user(SECOND), said, _user("And a third?")]
    again = _ask(client, input="And a third?", conversation={"id": conv.id})
    assert again.output_text == _ask(client, input=third).output_text
    list(_ask(client, input="One more.", conversation=conv.id, stream=True))
    _ended(client, _ask(client, input="Last.", conversation=conv.id, background=True).id)
    ids = [str(i.id) for i in client.conversations.items.list(conv.id, order="asc", limit=3)]
    assert len(ids) == len(set(ids)) == 9  # every page of three, by the SDK's cursor
    assert client.conversations.items.retrieve(ids[0], conversation_id=conv.id).id == ids[0]
    assert client.conversations.items.delete(ids[0], conversation_id=conv.id).id == conv.id
    assert len(client.conversations.items.list(conv.id, limit=100).data) == 8
    assert client.conversations.update(conv.id, metadata={"t": "x"}).metadata == {"t": "x"}
    cases: list[tuple[Any, str]] = [
        (lambda: _ask(client, input=FIRST, conversation=conv.id, previous_response_id=first.id),
         "conversation"),
        (lambda: client.conversations.create(items=[_item("web_search_call")]), "items[0].type"),
        (lambda: client.conversations.create(metadata={"k": "v" * 513}), "metadata"),
        (lambda: client.conversations.items.create(conv.id, items=[_user("x")] * 21), "items"),
        (lambda: client.conversations.items.create(conv.id, items=[]), "items"),
        (lambda: client.conversations.items.create(conv.id, items=[_role("wizard")]),
         "items[0].role"),  # a response could not read it: refused before it is kept
    ]  # fmt: skip
    for call, param in cases:
        with pytest.raises(openai.BadRequestError) as failed:
            call()
        assert failed.value.body["param"] == param  # type: ignore[index]
    assert client.conversations.delete(conv.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.conversations.retrieve(conv.id)
    with pytest.raises(openai.NotFoundError) as gone:
        _ask(client, input=FIRST, conversation=conv.id)
    assert gone.value.body["param"] == "conversation"  # type: ignore[index]


def test_input_tokens_are_those_the_response_takes_and_nothing_is_billed(
    client: openai.OpenAI, llm_up: KilnProcess
) -> None:
    """``responses.input_tokens.count``: the ``usage.input_tokens`` the same response reports,
    history and tools included; it writes no ledger row."""
    schema = {"type": "object", "properties": {"name": {"type": "string"}}}
    tool = {"type": "function", "name": "colour", "description": "A colour.", "parameters": schema}
    stored = _ask(client, input=FIRST, store=True)
    asks: list[dict[str, Any]] = [
        {"input": FIRST, "instructions": "Be brief."},
        {"input": FIRST, "tools": [tool]},
        {"input": SECOND, "previous_response_id": stored.id},
        {"previous_response_id": stored.id},  # no input: the model answers after the history
    ]
    rows, slis = "SELECT count(*) FROM usage_events", _sli_requests(llm_up)
    for fields in asks:
        billed = llm_up.sql(rows)
        counted = client.responses.input_tokens.count(model=MODEL, **fields)
        assert llm_up.sql(rows) == billed
        made = _ask(client, **fields)
        assert (counted.object, counted.input_tokens) == ("response.input_tokens",
                                                          made.usage.input_tokens)  # fmt: skip
    deadline = time.monotonic() + 10  # each request counts in the SLIs as it ends
    while _sli_requests(llm_up) < slis + len(asks) and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.3)
    assert _sli_requests(llm_up) == slis + len(asks)  # the responses, not the counts
    with pytest.raises(openai.NotFoundError):
        client.responses.input_tokens.count(model="no-such-model", input=FIRST)
    nothings: list[Any] = [{"input": []}, {}]
    for nothing in nothings:  # nothing to answer: no input, no history
        with pytest.raises(openai.BadRequestError) as empty:
            client.responses.input_tokens.count(model=MODEL, **nothing)
        assert empty.value.body["param"] == "input"  # type: ignore[index]


def _sli_requests(kiln: KilnProcess) -> float:
    """The model's requests in ``kiln_sli_requests_total`` (what its SLOs count), every plan
    and status class."""
    text, ours = httpx.get(f"{kiln.base_url}/metrics", timeout=10).text, f'model="{MODEL}"'
    lines = [line for line in text.splitlines() if line.startswith("kiln_sli_requests_total{")]
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if ours in line)


def _chat(client: openai.OpenAI, **fields: Any) -> Any:
    said = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": FIRST}]
    asked: Any = {"messages": said, "temperature": 0, "max_tokens": 8} | fields
    return client.chat.completions.create(model=MODEL, **asked)


def test_stored_chat_completions_are_listed_read_tagged_and_deleted(
    client: openai.OpenAI, llm_up: KilnProcess
) -> None:
    plain = _chat(client, store=True, metadata={"team": "a"})
    parts: Any = [{"role": "user", "content": [{"type": "text", "text": SECOND}]}]
    stream = _chat(client, messages=parts, store=True, stream=True, n=2,
                   stream_options={"include_usage": True})  # fmt: skip
    texts, usage, streamed_id = ["", ""], None, ""
    for chunk in stream:
        streamed_id, usage = chunk.id, chunk.usage or usage
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
    assert [c.message.content for c in client.chat.completions.retrieve(plain.id).choices] == [
        plain.choices[0].message.content
    ]
    kept = client.chat.completions.retrieve(streamed_id)  # kept before [DONE] was sent
    assert ([c.message.content for c in kept.choices], kept.usage) == (texts, usage)
    not_kept = _chat(client)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.retrieve(not_kept.id)
    mine = [plain.id, streamed_id]
    assert [c.id for c in client.chat.completions.list()] == mine
    assert [c.id for c in client.chat.completions.list(order="desc")] == mine[::-1]
    first = client.chat.completions.list(limit=1)
    assert ([c.id for c in first.data], first.has_more) == ([plain.id], True)
    assert [c.id for c in client.chat.completions.list(metadata={"team": "a"})] == [plain.id]
    assert list(client.chat.completions.list(model="another-model")) == []
    tagged = client.chat.completions.update(plain.id, metadata={"team": "b"})
    assert tagged.model_dump()["metadata"] == {"team": "b"}
    assert list(client.chat.completions.list(metadata={"team": "a"})) == []
    said = client.chat.completions.messages.list(streamed_id)
    assert [(m.role, m.content, m.content_parts is not None) for m in said] == [
        ("user", SECOND, True)
    ]
    llm_up.cli("tenants", "create", "chat-other")
    other = openai.OpenAI(base_url=client.base_url, api_key=llm_up.new_key("chat-other"))
    assert list(other.chat.completions.list()) == []
    with pytest.raises(openai.NotFoundError):
        other.chat.completions.retrieve(plain.id)
    assert client.chat.completions.delete(plain.id).deleted
    assert [c.id for c in client.chat.completions.list()] == [streamed_id]


@pytest.mark.parametrize(
    ("query", "param"),
    [("limit=0", "limit"), ("after=chatcmpl-nope", "after"), ("metadata[k]=" + "v" * 513,
     "metadata"), ("order=sideways", "order")],
)  # fmt: skip
def test_bad_chat_completion_lists_name_their_parameter(
    llm_up: KilnProcess, query: str, param: str
) -> None:
    r = httpx.get(f"{llm_up.base_url}/v1/chat/completions?{query}", timeout=10,
                  headers={"Authorization": f"Bearer {llm_up.key}"})  # fmt: skip
    assert r.status_code in (400, 404)
    assert r.json()["error"]["param"] == param


def test_the_console_logs_show_a_tenants_stored_items_to_its_people_only(
    client: openai.OpenAI, llm_up: KilnProcess, page: Page
) -> None:
    member, operator = "reader@acme.test", "ops@kiln.test"
    for email, role in ((member, "tenant-member"), (ADMIN, "tenant-admin")):
        llm_up.cli("users", "create", "--email", email, "--role", role, "--tenant", "acme",
                   "--password", PASSWORD)  # fmt: skip
    llm_up.cli("users", "create", "--email", operator, "--role", "platform-admin",
               "--password", PASSWORD)  # fmt: skip
    said = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Logged <b>here</b>?"},
    ]
    first = _chat(client, messages=said, store=True, metadata={"app": "console"})
    later = [_chat(client, store=True, max_tokens=1).id for _ in range(20)]  # a page's worth
    sign_in(page, member)
    page.get_by_role("link", name="Logs").click()
    rows = page.locator("#logs tbody tr")
    expect(rows.first).to_have_attribute("data-id", later[-1])  # newest first
    expect(rows).to_have_count(20)
    page.click("#older")  # htmx swaps the next page in
    settled(page)
    row = page.locator(f"#logs tr[data-id='{first.id}']")
    expect(row).to_contain_text("Logged <b>here</b>?")  # text, not markup
    expect(row).to_contain_text("app=console")
    assert axe_violations(page) == []
    page.get_by_label("Metadata").fill("app=console")  # the one tagged so, of 21
    page.get_by_role("button", name="Filter").click()
    settled(page)
    expect(rows).to_have_count(1)
    expect(rows.first).to_have_attribute("data-id", first.id)
    page.get_by_label("Model").fill("no-such-model")
    page.get_by_role("button", name="Filter").click()
    settled(page)
    expect(page.locator("#logs tbody")).to_contain_text("No stored chat completions that match.")
    page.get_by_label("Model").fill("")  # the metadata filter alone again
    page.get_by_role("button", name="Filter").click()
    settled(page)
    row.get_by_role("link").click()
    expect(page.locator("#log-messages")).to_contain_text("Be brief.")
    answer = first.choices[0].message.content or ""
    expect(page.locator("#log-answers")).to_contain_text(answer.strip()[:20])
    assert axe_violations(page) == []
    logs_url = page.url.rsplit("/", 1)[0]
    kept = _ask(client, input="Logged response?", store=True, metadata={"app": "responses"})
    page.goto(f"{logs_url}?kind=responses")
    row = page.locator(f"#logs tr[data-id='{kept.id}']")
    expect(row).to_contain_text("Logged response?")
    expect(row).to_contain_text("app=responses")
    page.get_by_label("Model").fill("no-such-model")  # responses filter as completions do
    page.get_by_role("button", name="Filter").click()
    settled(page)
    expect(page.locator("#logs tbody")).to_contain_text("No stored responses that match.")
    page.get_by_label("Model").fill(kept.model)
    page.get_by_label("Metadata").fill("app=responses")
    page.get_by_role("button", name="Filter").click()
    settled(page)
    expect(rows).to_have_count(1)
    expect(rows.first).to_have_attribute("data-id", kept.id)
    row.get_by_role("link").click()
    expect(page.locator("#log-messages")).to_contain_text("Logged response?")
    expect(page.locator("#log-answers")).to_contain_text(kept.output_text.strip()[:20])
    assert axe_violations(page) == []
    expect(page.locator("#log-delete")).to_have_count(0)  # a member reads, an admin deletes
    detail = page.url
    page.context.clear_cookies()
    sign_in(page, ADMIN)
    page.goto(detail)
    assert axe_violations(page) == []  # with its delete form
    page.get_by_role("button", name="Delete this response").click()
    page.wait_for_url(re.compile(r"/logs\?kind=responses$"))
    expect(page.locator(f"#logs tr[data-id='{kept.id}']")).to_have_count(0)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(kept.id)
    page.goto("/console/audit?action=log.delete")
    expect(page.locator("#audit tbody tr[data-action='log.delete']")).to_contain_text(kept.id)
    page.context.clear_cookies()
    sign_in(page, operator)  # prompts are the tenant's: an operator is refused
    expect(page.get_by_role("link", name="Logs")).to_have_count(0)
    refused = page.goto(logs_url)
    assert refused is not None
    assert refused.status == 403
