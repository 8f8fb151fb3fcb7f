"""Background responses (``background: true`` on ``/v1/responses``, as OpenAI's): the request is
checked and admitted as any other (a bad one is its 400), stored ``queued`` and answered at once;
its generation runs on in this gateway under the request's admission, detached (the concurrency
lease and the budget hold last until it ends, and it is billed once, like any request), and its
end replaces the stored response. ``GET`` reads it (``in_progress`` once it runs); ``POST
.../cancel`` ends it ``cancelled``: the generation stops at once on this gateway, at its next
lease renewal on another. A gateway that stops cancels its tasks (their responses fail, naming
why); one that dies leaves them to their lease (``response_store.LOST``). A streamed one
(``stream`` too) runs the Responses stream into a ``Feed`` its readers on this gateway follow;
its events are stored as they come (every ``FLUSH_S``) and with its end, so ``resume`` serves
them on any gateway, live. A run that fails without its stream saying so (its gateway stopped;
died, and its lease ran out; the work broke) ends with ``error`` and ``response.failed`` events, as
a foreground stream that fails after its start."""

from __future__ import annotations

import asyncio
import time
from contextlib import aclosing
from typing import TYPE_CHECKING, Any

import msgspec
import structlog
from sqlalchemy.exc import SQLAlchemyError

from kiln_platform.errors import KilnError
from kiln_platform.gateway.responses_schemas import ResponseError, ResponseObject

if TYPE_CHECKING:
    import uuid
    from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable

    from kiln_platform.admission.services import Admission
    from kiln_platform.gateway.response_store import ResponseStore

log = structlog.get_logger(__name__)
LEASE_S = 30.0
"""How long a running response's lease lasts; its gateway renews it every third of that."""
POLL_S = 0.5
"""How often a stream resumed on a gateway that does not run the response reads its events."""
FLUSH_S = 0.25
"""How often a running streamed response stores its new events for readers elsewhere."""
RETRY_S = 300.0
"""How long an end the database did not take is tried again (``KILN_OUTAGE_BOUND_S``'s 300 s)."""
STOPPED = "The server stopped before the response was done; create it again."
ENDS = (b"event: response.completed", b"event: response.incomplete", b"event: response.failed")
"""How a stream's last event starts once its run ended and said so."""


def _failed(shell: ResponseObject, message: str) -> ResponseObject:
    error = ResponseError(code="server_error", message=message)
    return msgspec.structs.replace(shell, status="failed", error=error)


def closing(made: int, response: dict[str, Any]) -> list[bytes]:
    """The ``error`` and ``response.failed`` events (numbered from ``made``) that end the stream
    of a failed run that did not end it (its gateway stopped or died, or the work broke), as a
    foreground stream that fails after its start ends."""
    error = response.get("error") or {}
    said = {"code": error.get("code"), "message": error.get("message"), "param": None}
    kinds: tuple[tuple[str, dict[str, Any]], ...] = (
        ("error", said), ("response.failed", {"response": response}),
    )  # fmt: skip
    return [
        b"event: %s\ndata: %s\n\n"
        % (kind.encode(), msgspec.json.encode({"type": kind, "sequence_number": made + i} | fields))
        for i, (kind, fields) in enumerate(kinds)
    ]


class Feed:
    """A streamed background response's events as its run makes them (``sequence_number`` is
    the index), for each reader from where it starts; the run goes on if a reader leaves. The
    events made once the answer is known (its ``done`` events, ``response.completed``) are held
    until the end is stored, as a foreground stream's last event waits for its store."""

    def __init__(self) -> None:
        self.events: list[bytes] = []
        """The events readers may have."""
        self.stored = 0
        """How many of them the database has (``BackgroundResponses._flush``)."""
        self.end: ResponseObject | None = None
        self.closed = False
        self._held: list[bytes] = []
        self._grown = asyncio.Event()

    def ended(self, response: ResponseObject) -> None:
        """The run's end (completed, incomplete or failed), known before its last events."""
        self.end = response

    async def pump(self, events: AsyncGenerator[bytes, None]) -> ResponseObject:
        """Run the stream to its end, keeping each event; the work of a streamed response."""
        async with aclosing(events):
            async for event in events:
                if self.end is not None:
                    self._held.append(event)
                    continue
                self.events.append(event)
                self._wake()
        assert self.end is not None, "a stream that ran out ends with its response"
        return self.end

    def fail(self, response: ResponseObject) -> None:
        """The run failed without its stream saying so: its closing events (``closing``)."""
        if self.end is None:
            self.end = response
            self.events += closing(len(self.events), msgspec.to_builtins(response))
            self._wake()

    def made(self) -> list[bytes]:
        """Every event the run made, those held included: what is stored at its end."""
        return [*self.events, *self._held]

    def close(self) -> None:
        """No more events (the end stored, or the run cancelled): the held ones go out."""
        self.events += self._held
        self._held, self.closed = [], True
        self._wake()

    def _wake(self) -> None:
        self._grown.set()
        self._grown = asyncio.Event()

    async def after(self, seen: int) -> AsyncIterator[bytes]:
        """The events after number ``seen`` (-1: all), then each as it comes, until closed."""
        at = seen + 1
        while True:
            grown = self._grown
            while at < len(self.events):
                yield self.events[at]
                at += 1
            if self.closed:
                return
            await grown.wait()


class BackgroundResponses:
    """This gateway's running background responses."""

    def __init__(
        self, store: ResponseStore, lease_s: float = LEASE_S, retry_s: float = RETRY_S
    ) -> None:
        self._store = store
        self._lease_s = lease_s
        self._retry_s = retry_s
        self._tasks: dict[str, tuple[asyncio.Future[ResponseObject], asyncio.Task[None]]] = {}
        """Each running response's work, and the task that waits for it and writes its end."""
        self._feeds: dict[tuple[uuid.UUID, str], Feed] = {}
        """The running streamed responses' events, by tenant and id."""
        self._stopping = False

    async def start(
        self, admission: Admission, shell: ResponseObject, history: list[dict[str, Any]],
        work: Callable[[], Awaitable[ResponseObject]], feed: Feed | None = None,
    ) -> None:  # fmt: skip
        """Store ``shell`` (``queued``) and run ``work`` after the request's response: the
        admission is left when it ends. If the store fails, nothing runs (the request fails).
        A streamed one's ``feed`` is read by ``resume`` while it runs, then stored with it."""
        tenant, key = admission.principal.tenant_id, (admission.principal.tenant_id, shell.id)
        await self._store.save(tenant, shell, history, self._lease_s, streamed=feed is not None)
        leave = admission.detach()
        running = asyncio.ensure_future(work())  # cancelled to stop; its end is always written
        ending = asyncio.create_task(self._end(tenant, shell, running, leave, feed))
        self._tasks[shell.id] = (running, ending)
        ending.add_done_callback(lambda _: self._tasks.pop(shell.id, None))
        if feed is not None:
            self._feeds[key] = feed
            ending.add_done_callback(lambda _: self._feeds.pop(key, None))

    async def resume(self, tenant: uuid.UUID, response_id: str, seen: int) -> AsyncIterator[bytes]:
        """``GET /v1/responses/{id}?stream=true&starting_after=seen``: the events of a streamed
        background response after number ``seen``, as they come: from its feed if this gateway
        runs it, else as its gateway stores them (read every ``POLL_S``) until it ends. A 404
        or a 400 (not streamed) is raised here, before the stream starts."""
        made = await self._store.events(tenant, response_id, max(seen, 0))
        return self._resumed(tenant, response_id, seen, made)

    async def _resumed(
        self, tenant: uuid.UUID, response_id: str, seen: int, made: tuple[int, list[bytes], bool]
    ) -> AsyncIterator[bytes]:
        while True:
            if (feed := self._feeds.get((tenant, response_id))) is not None:
                async for event in feed.after(seen):
                    yield event
                return
            first, events, running = made  # events numbered from first (the last seen's run)
            for event in events[max(seen + 1 - first, 0) :]:
                yield event
            total = first + len(events)
            seen = max(seen, total - 1)
            if not running:
                if not events or not events[-1].startswith(ENDS):  # its gateway died
                    body = await self._store.fetch(tenant, response_id)
                    if body["status"] == "failed":
                        for event in closing(total, body)[seen + 1 - total :]:
                            yield event
                return
            await asyncio.sleep(POLL_S)
            made = await self._store.events(tenant, response_id, seen)

    async def _end(
        self, tenant: uuid.UUID, shell: ResponseObject, running: asyncio.Future[ResponseObject],
        leave: Callable[[], Awaitable[None]], feed: Feed | None,
    ) -> None:  # fmt: skip
        """Wait for the work (renewing its lease), write its end, leave the admission."""
        renewing = asyncio.create_task(self._renew(tenant, shell.id, running))
        flushing = asyncio.create_task(self._flush(tenant, shell.id, feed)) if feed else None
        try:
            done = await running
        except asyncio.CancelledError:  # cancelled (the store says so), or the gateway stops
            done = _failed(shell, STOPPED)
        except KilnError as exc:
            done = _failed(shell, exc.message)
        except Exception:
            log.exception("background response failed", response_id=shell.id)
            done = _failed(shell, "Internal server error.")
        finally:
            renewing.cancel()
            if flushing is not None:
                flushing.cancel()
                await asyncio.gather(flushing, return_exceptions=True)  # none writes after
        if feed is not None and done.status == "failed" and not self._cancelled(running):
            feed.fail(done)
        first = feed.stored if feed is not None else 0
        events = feed.made()[first:] if feed is not None else []
        try:
            await self._store.finish(tenant, done, events, first)
            return
        except (SQLAlchemyError, OSError):
            log.warning("background response not stored yet", response_id=shell.id, exc_info=True)
        finally:
            if feed is not None:
                feed.close()
            await leave()
        await self._store_later(tenant, done, events, first)

    def _cancelled(self, running: asyncio.Future[ResponseObject]) -> bool:
        """The work was stopped by a cancel of its response (not by this gateway stopping)."""
        return running.cancelled() and not self._stopping

    async def _store_later(
        self, tenant: uuid.UUID, done: ResponseObject, events: list[bytes], first: int
    ) -> None:
        """Write an end the database did not take, again and again (backing off) for up to
        ``retry_s``: a response made and billed during an outage shorter than that reads as it
        ended once the database is back, not as lost. Past it, its lease decides (failed)."""
        pause, deadline = 0.5, time.monotonic() + self._retry_s
        while time.monotonic() + pause < deadline:
            await asyncio.sleep(pause)
            try:
                await self._store.finish(tenant, done, events, first)
                return
            except (SQLAlchemyError, OSError):
                pause = min(pause * 2, self._lease_s / 3)
        log.error("background response lost: its end was never stored", response_id=done.id)

    async def _flush(self, tenant: uuid.UUID, response_id: str, feed: Feed) -> None:
        """Store the feed's new events every ``FLUSH_S`` while the run lasts (a failed write is
        tried again, with those made since, at the next; readers elsewhere wait meanwhile)."""
        while True:
            await asyncio.sleep(FLUSH_S)
            if len(feed.events) > feed.stored:
                made = len(feed.events)
                try:
                    await self._store.progress(
                        tenant, response_id, feed.stored, feed.events[feed.stored : made]
                    )
                    feed.stored = made
                except (SQLAlchemyError, OSError):
                    log.warning("background events not stored yet", response_id=response_id)

    async def _renew(
        self, tenant: uuid.UUID, response_id: str, running: asyncio.Future[Any]
    ) -> None:
        """Keep the lease (the first renewal marks it ``in_progress``); stop the work once the
        response is live no more (cancelled or deleted, through any gateway)."""
        while True:
            try:
                live = await self._store.renew(tenant, response_id, self._lease_s)
            except (SQLAlchemyError, OSError):  # the database away: the work goes on
                live = True
            if not live:
                running.cancel()
                return
            await asyncio.sleep(self._lease_s / 3)

    async def cancel(self, tenant_id: uuid.UUID, response_id: str) -> dict[str, Any]:
        """``POST /v1/responses/{id}/cancel``: the stored response ends ``cancelled`` and, if
        this gateway runs it, its generation stops now."""
        body = await self._store.cancel(tenant_id, response_id)
        if (running := self._tasks.get(response_id)) is not None:
            running[0].cancel()
        return body

    async def stop(self, wait_s: float = 5.0) -> None:
        """Cancel the running responses (each fails, naming why) and wait for their ends; an
        end still being tried again after ``wait_s`` (the database away) is given up."""
        running, self._stopping = list(self._tasks.values()), True
        for work, _ in running:
            work.cancel()
        if endings := [ending for _, ending in running]:
            _, late = await asyncio.wait(endings, timeout=wait_s)
            for ending in late:
                ending.cancel()
            await asyncio.gather(*late, return_exceptions=True)
