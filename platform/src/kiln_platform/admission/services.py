"""One request's admission, entered in stages and left once.

A request meets the stages in this order:

1. ``enter``: its quotas (requests/min, tokens/min, the concurrency lease), right after
   authentication, before the body is looked at (``admission.deps``);
2. ``schedule``: its priority and deadline (``QueueTerms``), for requests that go to a worker;
3. ``hold``: the worst case of its quantities against the monthly budget, once tokenized;
4. ``dispatched`` / ``meter``: from the call to a worker on, it is recorded in the ledger exactly
   once: ``commit`` (durable before the response's last bytes), an error's status (unbilled),
   or, for a generation, what it consumed by the time it ended;
5. ``leave``: what was not recorded is, the lease and whatever hold the ledger was not handed
   are released, and a request for a model (``serves``) is counted in its SLOs (in memory).
   ``admission.middleware`` runs it when the response (a stream included) is over: success,
   error, cancellation, client disconnect, deadline cut.

While the admission is open its lease and hold are renewed by their owners
(``QuotaEnforcer``, ``Budgets``), so a stream that runs for minutes keeps them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, Self

from kiln_platform.admission.shed import RecentRefusals
from kiln_platform.errors import KilnError
from kiln_platform.quotas.enforcer import QuotaGrant
from kiln_platform.scheduler.schemas import Priority
from kiln_runtimes import tracing

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
    from types import TracebackType

    from kiln_platform.billing.ledger import Usage
    from kiln_platform.billing.pricing import Quantities
    from kiln_platform.billing.reservations import Budgets
    from kiln_platform.gateway.metrics import RequestMetrics
    from kiln_platform.keys.services import Principal
    from kiln_platform.quotas.enforcer import QuotaEnforcer
    from kiln_platform.registry.outcomes import RolloutOutcomes
    from kiln_platform.registry.services import ResolvedVersion
    from kiln_platform.slo.sli import SliRecorder

STATE_KEY = "kiln_admission"


class UsageSink(Protocol):
    """Where an admission records its request's usage: the ledger (``LedgerWriter``), or a
    batch line's own transaction (``batches.lines``)."""

    @property
    def enabled(self) -> bool:
        """Whether usage is recorded at all (``KILN_METERING``)."""
        ...

    def record(self, usage: Usage) -> None:
        """Queue the usage without waiting."""
        ...

    async def commit(self, usage: Usage) -> None:
        """Return once the usage is durable (or handed to what makes it so)."""
        ...


@dataclass(frozen=True, slots=True)
class QueueTerms:
    """How the pool's fair queue treats a request: whose it is, its weight, class, deadline."""

    tenant: str
    weight: float = 1.0
    priority: Priority = Priority.INTERACTIVE
    timeout_s: float | None = None
    arrived: float | None = None
    """``time.monotonic()`` when the request arrived: its deadline counts from then."""

    def left_s(self) -> float | None:
        """What is left of the timeout now: the time spent before the request reached its
        pool's queue (authenticating, tokenizing, waiting for the event loop under overload)
        counts against the deadline, so a request that waited past it is refused at once
        (504) instead of being served late."""
        if self.timeout_s is None or self.arrived is None:
            return self.timeout_s
        return self.timeout_s - (time.monotonic() - self.arrived)


class Admissions:
    """The per-process desk: opens one :class:`Admission` per HTTP request."""

    def __init__(
        self,
        quotas: QuotaEnforcer,
        budgets: Budgets,
        ledger: UsageSink,
        slis: SliRecorder | None = None,
        metrics: RequestMetrics | None = None,
        *,
        outcomes: RolloutOutcomes | None = None,
    ) -> None:
        self.quotas = quotas
        self.budgets = budgets
        self.ledger = ledger
        self.slis = slis
        """Where each recorded request is judged against its model's SLOs (in memory)."""
        self.metrics = metrics
        """The per-request series by model, version and tenant."""
        self.outcomes = outcomes
        """Each request's outcome, counted for its model's running rollout (in memory)."""
        self.refusals = RecentRefusals()
        """The pools' recent refusals, repeated by the shed gate (``admission.gate``)."""

    def open(self, state: dict[str, object]) -> Admission:
        """The request's admission, kept in its ASGI state (``state["request_id"]`` is its id)."""
        admission = Admission(self, str(state.get("request_id", "")))
        state[STATE_KEY] = admission
        return admission


class Admission:
    """One request's admission (an async context manager: leaving it is ``leave``)."""

    def __init__(self, desk: Admissions, request_id: str) -> None:
        self._desk = desk
        self.request_id = request_id
        self._principal: Principal | None = None
        self.grant = QuotaGrant()
        """What the quotas decided: rate-limit headers, the concurrency lease."""
        self.terms = QueueTerms(tenant="")
        self.deadline: float | None = None
        """Loop time the response must be sent by (a generation's stream deadline)."""
        self.closers: list[Callable[[], Awaitable[object]]] = []
        """Run first when leaving (e.g. a stream's generator, to cancel the worker's sequence)."""
        self._usage: Callable[[], Usage] | None = None
        self._opened = time.monotonic()
        self._first_token: float | None = None
        self._model: str | None = None
        self._split = False
        self._outcome: Usage | None = None
        """The usage recorded (model, version, tenant, status): the request's metrics."""
        self._error: str | None = None
        self.degenerate = False
        """A generation that came back empty or cut at its length limit (for rollouts)."""
        self.response_status: int | None = None
        """The status the response started with (``admission.middleware`` sets it)."""
        self._recorded = False
        self._paced = True
        """Its tokens count against tokens/min: every request but a batch line (``run_for``)."""
        self._left = False
        self._detached = False

    @property
    def principal(self) -> Principal:
        """Who the request is for (set by ``enter``)."""
        if self._principal is None:
            raise RuntimeError("the admission was not entered")
        return self._principal

    async def enter(self, principal: Principal) -> None:
        """Count the request against its quotas, or raise ``RateLimited`` (429)."""
        self._principal = principal
        self.terms = QueueTerms(tenant=str(principal.tenant_id), weight=principal.weight)
        with tracing.span("admission", {"kiln.tenant": self.terms.tenant}):
            await self._desk.quotas.admit(principal, self.grant)

    def run_for(self, principal: Principal, timeout_s: float) -> None:
        """Enter work Kiln runs on the tenant's behalf (a batch line) in the ``batch`` class: its
        budget hold and usage as any request's; no per-minute quotas (they pace clients)."""
        self._principal, self._paced = principal, False
        self.terms = QueueTerms(str(principal.tenant_id), principal.weight, Priority.BATCH,
                                timeout_s)  # fmt: skip

    def schedule(self, priority: Priority, timeout_s: float) -> None:
        """Set the request's class and deadline in its pool's fair queue."""
        self.terms = dataclasses.replace(
            self.terms, priority=priority, timeout_s=timeout_s, arrived=self._opened
        )

    def serve_as(self, tier: str | None) -> None:
        """OpenAI's ``service_tier``: ``flex`` runs the request in the ``batch`` class, priced as
        a batch line; ``default``, ``scale`` and ``priority`` in the ``interactive`` class;
        ``auto`` or none leaves the class its headers chose. A batch line stays a batch line."""
        if tier in (None, "auto") or not self._paced:
            return
        priority = Priority.BATCH if tier == "flex" else Priority.INTERACTIVE
        self.terms = dataclasses.replace(self.terms, priority=priority)

    @property
    def service_tier(self) -> str:
        """The tier the request is served in, as OpenAI names it (``flex``: the batch class)."""
        return "flex" if self.terms.priority is Priority.BATCH else "default"

    @contextlib.contextmanager
    def screening(self, model: str) -> Iterator[None]:
        """Around a pool's early screen of the request (for ``model`` as requested): a refusal
        with a retry time is held for the requests that follow (``admission.shed``)."""
        try:
            yield
        except KilnError as exc:
            terms = self.terms
            self._desk.refusals.hold((terms.tenant, model, terms.priority), terms.timeout_s, exc)
            raise

    async def hold(
        self, version: ResolvedVersion, most: Quantities, run_s: float | None = None
    ) -> None:
        """Hold the most the request can cost (``run_s``: the server's bound on its run, else the
        request timeout), or raise ``QuotaExceeded`` (429)."""
        with tracing.span("admission.hold", {"kiln.model": version.model}):
            await self._desk.budgets.reserve(self.principal, self.request_id, version, most, run_s)

    def serves(self, model: str, *, split: bool = False) -> None:
        """The request is for ``model``: however it ends, it counts in the model's SLOs, and in
        its running rollout if its route's split chose the version (``split``)."""
        self._model, self._split = model, split

    def first_token(self) -> None:
        """A generation's first token is out: its SLO latency is the time to it."""
        if self._first_token is None:
            self._first_token = time.monotonic()

    def meter(self, usage: Callable[[], Usage]) -> None:
        """From now on the request is recorded exactly once: ``usage()`` when it ends, unless it
        was committed or recorded before."""
        self._usage = usage

    @contextlib.asynccontextmanager
    async def dispatched(self, usage: Usage) -> AsyncIterator[None]:
        """Around a call to a worker: a Kiln error it raises is recorded (unbilled, with its
        status) before it propagates."""
        try:
            yield
        except KilnError as exc:
            self._error = exc.code
            self.record(dataclasses.replace(usage, status=exc.status_code))
            raise

    def record(self, usage: Usage) -> None:
        """Record the request's usage without waiting (once; later calls do nothing)."""
        if not self._recorded:
            self._recorded = True
            self._desk.ledger.record(self._metered(usage))

    async def commit(self, usage: Usage) -> None:
        """Record the request's usage and return once it is durable; 503 if it cannot be."""
        if not self._recorded:
            self._recorded = True
            with tracing.span("ledger commit"):
                await self._desk.ledger.commit(self._metered(usage))

    def _metered(self, usage: Usage) -> Usage:
        """The usage the ledger settles the hold with; its tokens charged to tokens/min, unless
        it is a batch line's (that limit paces clients' requests, not the tenant's batches; a
        client's own request in the batch class is paced as any)."""
        desk, self._outcome = self._desk, usage
        if desk.ledger.enabled:  # the ledger's write settles the hold: leaving does not
            usage = dataclasses.replace(usage, held=desk.budgets.handed(usage.request_id))
        if self.terms.priority is Priority.BATCH:  # a line, or flex: the batch discount
            usage = dataclasses.replace(usage, batch=True)
        if self._paced:
            tokens = usage.input_tokens + usage.output_tokens
            desk.quotas.charge(usage.tenant_id, usage.api_key_id, tokens)
        return usage

    def detach(self) -> Callable[[], Awaitable[None]]:
        """The request's work goes on after its response (a background response): leaving when
        the response ends does nothing; the call returned leaves, once the work is done."""
        self._detached = True

        async def leave() -> None:
            self._detached = False
            await self.leave()

        return leave

    async def leave(self) -> None:
        """Close what the response left open, record what was not, release the lease and the
        hold (once; shielded from the request's cancellation); not while detached."""
        if not self._left and not self._detached:
            self._left = True
            await asyncio.shield(self._leave())

    async def _leave(self) -> None:
        desk = self._desk
        try:
            for close in self.closers:  # e.g. a stream cut mid-send: its generation ends
                with contextlib.suppress(Exception):
                    await close()
            if self._usage is not None:
                self.record(self._usage())
            if self.grant.lease is not None:
                await desk.quotas.release(self.grant.lease)
        finally:
            self._finished()
            if self.request_id:
                await desk.budgets.finish(self.request_id)

    def _finished(self) -> None:
        """Count the request once, in its model's series and SLIs (in memory), with one status:
        the one the ledger recorded, else the response's, else 499 (the client went away)."""
        usage, desk = self._outcome, self._desk
        if self._principal is None or (usage is None and self._model is None):
            return
        status = (usage.status if usage is not None else 0) or self.response_status or 499
        now = time.monotonic()
        if desk.metrics is not None and usage is not None:
            who = desk.metrics.labels(usage.model, usage.version, str(usage.tenant_id))
            desk.metrics.finished(who, usage.endpoint, now - self._opened, status, self._error)
        latency = (self._first_token or now) - self._opened
        if desk.slis is not None and self._model is not None:
            desk.slis.observe(self._model, self.principal.plan, status, latency, time.time())
        if desk.outcomes is not None and usage is not None and self._split:
            desk.outcomes.observe(usage.model, usage.version, status, latency, self.degenerate)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.leave()
