"""Background responses on PostgreSQL: the runner stores a response ``queued``, marks it
``in_progress`` while it runs and replaces it by its end; a cancel through another gateway stops
the work at that gateway's next lease renewal; a gateway that stops fails its responses, naming
why; one whose lease ran out (its gateway died) reads as failed. The request's admission is left
once the work ends, not when the response was sent."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from types import SimpleNamespace
from typing import Any

import asyncpg
import msgspec
import pytest
from sqlalchemy import func, select

from kiln_platform.admission.services import Admission
from kiln_platform.db.database import Database
from kiln_platform.db.engine import TENANT_ROLE
from kiln_platform.errors import BadRequest
from kiln_platform.gateway.background import STOPPED, BackgroundResponses, Feed
from kiln_platform.gateway.response_events import EventRun
from kiln_platform.gateway.response_store import LIVE, LOST, ResponseStore
from kiln_platform.gateway.responses_schemas import ResponseObject
from tests.factories import make_tenant

SECRET = b"a server secret for tests"


def _shell(ident: str) -> ResponseObject:
    return ResponseObject(
        id=ident, created_at=0, model="m", status="queued", output=[], instructions=None,
        max_output_tokens=None, temperature=1.0, top_p=1.0, usage=None, user=None, metadata={},
        store=True, background=True,
    )  # fmt: skip


def _admission(tenant: uuid.UUID, left: list[str]) -> Admission:
    """A request's admission for ``tenant`` (no quotas, hold or usage to settle); leaving it
    appends ``"left"`` to ``left``."""
    admission = Admission(SimpleNamespace(), "")  # type: ignore[arg-type]
    admission.run_for(SimpleNamespace(tenant_id=tenant, weight=1.0), 60)  # type: ignore[arg-type]

    async def closed() -> None:
        left.append("left")

    admission.closers.append(closed)
    return admission


async def _status(store: ResponseStore, tenant: uuid.UUID, ident: str, want: str) -> Any:
    for _ in range(100):
        if (body := await store.fetch(tenant, ident))["status"] == want:
            return body
        await asyncio.sleep(0.05)
    raise AssertionError(f"{ident} never {want}: {body['status']}")


async def _left(left: list[str]) -> None:
    """Wait (bounded) for the admission to be left: the runner's last step, after its write."""
    for _ in range(100):
        if left:
            break
        await asyncio.sleep(0.02)
    assert left == ["left"]


@pytest.fixture
async def tenant(db: Database) -> uuid.UUID:
    async with db.sessions.begin() as session:
        return await make_tenant(session)


async def test_a_run_is_in_progress_then_its_end_and_leaves_after(
    db: Database, tenant: uuid.UUID
) -> None:
    store, left, go = ResponseStore(db.sessions, SECRET, 30), list[str](), asyncio.Event()
    runner = BackgroundResponses(store)

    async def work() -> ResponseObject:
        await go.wait()
        return msgspec.structs.replace(_shell("resp-run"), status="completed")

    await runner.start(_admission(tenant, left), _shell("resp-run"), [], work)
    await _status(store, tenant, "resp-run", "in_progress")
    with pytest.raises(BadRequest, match="still in_progress"):
        await store.conversation(tenant, "resp-run")
    assert left == []  # the response was sent; the admission is held while the work runs
    go.set()
    done = await _status(store, tenant, "resp-run", "completed")
    assert done["background"] is True
    await _left(left)
    assert (await store.cancel(tenant, "resp-run"))["status"] == "completed"  # ended: as it is


async def test_a_cancel_through_another_gateway_stops_the_work(
    db: Database, tenant: uuid.UUID
) -> None:
    store, left, stopped = ResponseStore(db.sessions, SECRET, 30), list[str](), asyncio.Event()
    running, other = BackgroundResponses(store, lease_s=0.3), BackgroundResponses(store)

    async def work() -> ResponseObject:
        try:
            await asyncio.sleep(60)
        finally:
            stopped.set()
        raise AssertionError("not cancelled")

    await running.start(_admission(tenant, left), _shell("resp-far"), [], work)
    assert (await other.cancel(tenant, "resp-far"))["status"] == "cancelled"
    await asyncio.wait_for(stopped.wait(), 5)  # at the runner's next renewal
    await _left(left)  # after the runner's (refused) write of its end
    assert (await store.fetch(tenant, "resp-far"))["status"] == "cancelled"  # not "failed"


async def test_a_stopping_gateway_fails_its_responses_naming_why(
    db: Database, tenant: uuid.UUID
) -> None:
    store, left = ResponseStore(db.sessions, SECRET, 30), list[str]()
    runner = BackgroundResponses(store)

    async def work() -> ResponseObject:
        await asyncio.sleep(60)
        raise AssertionError("not stopped")

    await runner.start(_admission(tenant, left), _shell("resp-stop"), [], work)
    await runner.stop()
    body = await store.fetch(tenant, "resp-stop")
    assert (body["status"], body["error"]["message"]) == ("failed", STOPPED)
    assert left == ["left"]


async def test_a_response_whose_lease_ran_out_reads_as_failed(
    db: Database, tenant: uuid.UUID
) -> None:
    store = ResponseStore(db.sessions, SECRET, 30)
    await store.save(tenant, _shell("resp-dead"), [], lease_s=0.05)  # no gateway renews it
    await asyncio.sleep(0.1)
    body = await store.fetch(tenant, "resp-dead")
    assert (body["status"], body["error"]["message"]) == ("failed", LOST)
    assert await store.conversation(tenant, "resp-dead") == []  # ended: it can be gone on from
    assert not await store.renew(tenant, "resp-other", 30)


@asynccontextmanager
async def _refused(database_uri: str) -> AsyncIterator[None]:
    """The database refuses tenant transactions' writes of responses (a real error from
    PostgreSQL, as an outage gives one) until the block ends."""
    owner = await asyncpg.connect(database_uri)
    await owner.execute(f"REVOKE UPDATE ON responses FROM {TENANT_ROLE}")
    try:
        yield
    finally:
        await owner.execute(f"GRANT UPDATE ON responses TO {TENANT_ROLE}")
        await owner.close()


async def test_an_end_the_database_refused_is_written_once_it_takes_it(
    db: Database, tenant: uuid.UUID, database_uri: str
) -> None:
    """The work ended (made and billed) while the database took no write: the admission is left
    at once, and the end is tried again until stored, not left to read as lost."""
    store, left, go = ResponseStore(db.sessions, SECRET, 30), list[str](), asyncio.Event()
    runner = BackgroundResponses(store)

    async def work() -> ResponseObject:
        await go.wait()
        return msgspec.structs.replace(_shell("resp-outage"), status="completed")

    await runner.start(_admission(tenant, left), _shell("resp-outage"), [], work)
    async with _refused(database_uri):
        go.set()
        await _left(left)
        assert (await store.fetch(tenant, "resp-outage"))["status"] in LIVE
    await _status(store, tenant, "resp-outage", "completed")


async def test_a_stopping_gateway_gives_up_an_end_the_database_refuses(
    db: Database, tenant: uuid.UUID, database_uri: str
) -> None:
    store, left = ResponseStore(db.sessions, SECRET, 30), list[str]()
    runner = BackgroundResponses(store)

    async def work() -> ResponseObject:
        return msgspec.structs.replace(_shell("resp-given-up"), status="completed")

    async with _refused(database_uri):
        await runner.start(_admission(tenant, left), _shell("resp-given-up"), [], work)
        await _left(left)
        started = time.monotonic()
        await runner.stop(wait_s=0.2)
        assert time.monotonic() - started < 2
    assert (await store.fetch(tenant, "resp-given-up"))["status"] in LIVE  # its lease decides


def _event(n: int) -> bytes:
    return b'event: e\ndata: {"sequence_number": %d}\n\n' % n


async def test_a_stream_resumes_on_another_gateway_as_the_run_goes(
    db: Database, tenant: uuid.UUID
) -> None:
    """The gateway that does not run it polls the store: the events after the one given, as
    the runner stores them while it runs (those made once the answer is known only with its
    end); the runner's own readers follow its feed."""
    store, left, go = ResponseStore(db.sessions, SECRET, 30), list[str](), asyncio.Event()
    here, there = BackgroundResponses(store), BackgroundResponses(store)
    feed, end = Feed(), msgspec.structs.replace(_shell("resp-streamed"), status="completed")

    async def events() -> AsyncGenerator[bytes, None]:
        yield _event(0)
        yield _event(1)
        await go.wait()
        yield _event(2)
        feed.ended(end)
        yield _event(3)  # made once the answer is known: held until the end is stored

    shell = _shell("resp-streamed")
    await here.start(_admission(tenant, left), shell, [], partial(feed.pump, events()), feed)
    local = await here.resume(tenant, "resp-streamed", 0)
    assert await anext(local) == _event(1)
    live = await there.resume(tenant, "resp-streamed", 0)
    assert await asyncio.wait_for(anext(live), 5) == _event(1)  # while it runs, elsewhere
    remote = asyncio.ensure_future(_all(live))
    await asyncio.sleep(0.1)
    assert not remote.done()  # still running on the other gateway
    go.set()
    assert await anext(local) == _event(2)
    assert await anext(local) == _event(3)
    assert (await store.fetch(tenant, "resp-streamed"))["status"] == "completed"
    assert [event async for event in local] == []
    assert await asyncio.wait_for(remote, 5) == [_event(2), _event(3)]
    assert await _all(await there.resume(tenant, "resp-streamed", -1)) == [
        _event(0), _event(1), _event(2), _event(3),
    ]  # fmt: skip
    await store.save(tenant, _shell("resp-plain"), [])
    with pytest.raises(BadRequest, match="stream"):
        await there.resume(tenant, "resp-plain", -1)


async def test_events_are_stored_as_runs_appended(db: Database, tenant: uuid.UUID) -> None:
    """Each write of a streamed response's events appends those made since the last (the bytes
    stored grow as the stream, not as its square); a write tried again from the same number
    replaces its run; a reader elsewhere gets each event after the one it names, once."""
    store = ResponseStore(db.sessions, SECRET, 30)
    reader, events = BackgroundResponses(store), [_event(i) for i in range(10)]
    await store.save(tenant, _shell("resp-runs"), [], lease_s=30, streamed=True)
    await store.progress(tenant, "resp-runs", 0, events[:2])
    await store.progress(tenant, "resp-runs", 2, events[2:3])  # its answer lost: tried again
    await store.progress(tenant, "resp-runs", 2, events[2:6])
    await store.progress(tenant, "resp-runs", 6, events[6:8])
    assert (await store.events(tenant, "resp-runs", 7))[:2] == (6, events[6:8])
    end = msgspec.structs.replace(_shell("resp-runs"), status="completed")
    assert await store.finish(tenant, end, events[8:], 8)
    for seen in (-1, 0, 1, 2, 5, 7, 9, 20):
        assert await _all(await reader.resume(tenant, "resp-runs", seen)) == events[seen + 1 :]
    async with db.sessions() as session:
        runs = (await session.execute(
            select(EventRun.first, EventRun.until, func.length(EventRun.sealed))
            .where(EventRun.response_id == "resp-runs").order_by(EventRun.first)
        )).all()  # fmt: skip
    assert [(first, until) for first, until, _ in runs] == [(0, 2), (2, 6), (6, 8), (8, 10)]
    assert sum(size for _, _, size in runs) < len(b"".join(events)) + 64 * len(runs)


async def _one_then_stuck() -> AsyncGenerator[bytes, None]:
    """A run's stream that makes event 0, then waits until it is cancelled or stopped."""
    yield _event(0)
    await asyncio.sleep(60)
    raise AssertionError("neither cancelled nor stopped")


async def test_a_cancelled_stream_ends_with_the_events_it_made(
    db: Database, tenant: uuid.UUID
) -> None:
    store, left, feed = ResponseStore(db.sessions, SECRET, 30), list[str](), Feed()
    runner = BackgroundResponses(store)

    shell = _shell("resp-cut")
    run = partial(feed.pump, _one_then_stuck())
    await runner.start(_admission(tenant, left), shell, [], run, feed)
    reading = await runner.resume(tenant, "resp-cut", -1)
    assert await anext(reading) == _event(0)
    assert (await runner.cancel(tenant, "resp-cut"))["status"] == "cancelled"
    assert [event async for event in reading] == []  # the stream ends
    await _left(left)
    assert await _all(await runner.resume(tenant, "resp-cut", -1)) == [_event(0)]


async def test_a_stream_whose_run_stopped_or_died_ends_failed(
    db: Database, tenant: uuid.UUID
) -> None:
    """A gateway that stops ends its streams with ``error`` and ``response.failed``, for its
    readers and those elsewhere; one that died leaves events without that end: readers elsewhere
    get it once its lease ran out, numbered after the last event it stored."""
    store, left, feed = ResponseStore(db.sessions, SECRET, 30), list[str](), Feed()
    runner, other = BackgroundResponses(store), BackgroundResponses(store)

    shell = _shell("resp-stopped")
    run = partial(feed.pump, _one_then_stuck())
    await runner.start(_admission(tenant, left), shell, [], run, feed)
    reading = await runner.resume(tenant, "resp-stopped", 0)
    await runner.stop()
    ends = [msgspec.json.decode(event.split(b"data: ")[1]) async for event in reading]
    assert [(end["type"], end["sequence_number"]) for end in ends] == [
        ("error", 1), ("response.failed", 2),
    ]  # fmt: skip
    assert ends[0]["message"] == STOPPED
    assert ends[1]["response"]["error"]["message"] == STOPPED
    assert await _all(await other.resume(tenant, "resp-stopped", 0)) == feed.events[1:]

    await store.save(tenant, _shell("resp-died"), [], lease_s=0.3, streamed=True)
    await store.progress(tenant, "resp-died", 0, [_event(0), _event(1)])  # then nobody renews it
    reading = await other.resume(tenant, "resp-died", 0)
    assert await anext(reading) == _event(1)
    ends = [msgspec.json.decode(event.split(b"data: ")[1]) async for event in reading]
    assert [(end["type"], end["sequence_number"]) for end in ends] == [
        ("error", 2), ("response.failed", 3),
    ]  # fmt: skip
    assert ends[1]["response"]["error"]["message"] == LOST
    again = await _all(await other.resume(tenant, "resp-died", 2))
    assert [msgspec.json.decode(event.split(b"data: ")[1])["type"] for event in again] == [
        "response.failed"
    ]


async def _all(events: AsyncIterator[bytes]) -> list[bytes]:
    return [event async for event in events]
