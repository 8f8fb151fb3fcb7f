"""The gateway's shadow traffic: copies of a share of a model's requests sent to a candidate
version once the primary has answered, compared, and never billed.

A copy skips the tenant's admission altogether (no quota, budget or ledger row): it is queued
in the candidate's pool as the ``shadow`` tenant at batch priority, and only when both the
primary's pool and the candidate's are idle enough (``policy.drop_reason``); otherwise it is
dropped and counted. It starts after the primary's answer is in hand, as a task of its own, so
the response, its headers and its latency do not wait for it. The task runs in a context of its
own, not the primary request's: its dispatch must not write the primary's ``Server-Timing``,
join its trace or log under its request id (its logs carry the copy's id instead).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import os
import socket
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec
import numpy as np
import structlog
from prometheus_client import Counter

from kiln_platform.admission.services import QueueTerms
from kiln_platform.scheduler.schemas import Priority
from kiln_platform.shadow import policy
from kiln_platform.shadow.policy import Agreement, CandidateLoad, DropLimits
from kiln_platform.shadow.services import persist
from kiln_platform.shadow.stats import ShadowStats
from kiln_runtimes.protocol import DATATYPES, EmbedRequest, GenerateRequest, InferRequest
from kiln_runtimes.tensor_bytes import BYTES

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

    from kiln_platform.gateway.dispatch import WorkerClient
    from kiln_platform.pools.services import PoolManager
    from kiln_platform.registry.resolver import Resolver
    from kiln_platform.registry.services import ResolvedVersion
    from kiln_platform.shadow.schemas import ShadowReport
    from kiln_runtimes.protocol import InferResult, Tensor

log = structlog.get_logger("kiln.shadow")

_WHO = ["model", "candidate"]
MIRRORED = Counter("kiln_shadow_mirrored", "Copies sent to a shadow candidate.", _WHO)
DROPPED = Counter(
    "kiln_shadow_dropped", "Copies not sent (primary or candidate busy).", [*_WHO, "reason"]
)
FAILED = Counter("kiln_shadow_failed", "Copies the candidate answered with an error.", _WHO)
COMPARED = Counter(
    "kiln_shadow_compared", "Copies compared with the primary's answer.", [*_WHO, "agrees"]
)
SHADOW_TENANT = "shadow"
"""The fair queue's tenant for copies: one flow, never charged to a real tenant."""


def gateway_name() -> str:
    """This gateway in the persisted reports: host and process."""
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True, slots=True)
class Plan:
    """A request chosen for copying: the candidate and its running comparison."""

    candidate: ResolvedVersion
    stats: ShadowStats
    primary: str
    """The pool of the version that answered: its spare capacity decides too."""
    scores: bool = False
    """The version that answered is a cross-encoder or a classifier: its rows are scores or
    probabilities, not vectors."""


class Mirror:
    """Chooses, sends and compares copies; keeps one ``ShadowStats`` per (model, candidate)."""

    def __init__(
        self, resolver: Resolver, pools: PoolManager, workers: WorkerClient, timeout_s: float,
        limits: DropLimits | None = None,
    ) -> None:  # fmt: skip
        self._resolver, self._pools, self._workers = resolver, pools, workers
        self._terms = QueueTerms(SHADOW_TENANT, priority=Priority.BATCH, timeout_s=timeout_s)
        self._limits = limits or DropLimits()
        self.gateway = gateway_name()
        self.stats: dict[tuple[str, str], ShadowStats] = {}
        self._busy: dict[str, float] = {}
        """Each primary pool's load, averaged over its answers (``policy.smoothed``)."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._saver: asyncio.Task[None] | None = None
        self._sessions: async_sessionmaker[AsyncSession] | None = None

    def plan(self, version: ResolvedVersion, request_id: str) -> Plan | None:
        """The copy to make of this request, if its model has a shadow and the request is in
        its share (the candidate is never the version that answered)."""
        shadow = self._resolver.shadows.get(version.model)
        if shadow is None or shadow.version == version.version:
            return None
        _, in_flight, queued = self._pools.load(version.pool)  # every answer: the average
        self._busy[version.pool] = policy.smoothed(self._busy.get(version.pool), in_flight + queued)
        if not policy.sampled(request_id, shadow.percent):
            return None
        candidate = self._resolver.served.get(version.model, {}).get(shadow.version)
        if candidate is None or candidate.manifest.task != version.manifest.task:
            return None
        key = (version.model, shadow.version)
        stats = self.stats.get(key) or self.stats.setdefault(key, ShadowStats(*key))
        asked, offered = version.manifest, candidate.manifest
        if (asked.prompts, asked.default_prompt_name) != (
            offered.prompts,
            offered.default_prompt_name,
        ):
            stats.skip()  # the ids carry the primary's prompt, which the candidate would not add
            return None
        return Plan(
            candidate,
            stats,
            version.pool,
            scores=version.manifest.scores or bool(version.manifest.labels),
        )

    def embed(self, plan: Plan, ids: list[list[int]], primary: np.ndarray, took_s: float) -> None:
        """Copy an embeddings request; cosine of each row with the primary's (a
        cross-encoder's scores, a classifier's probabilities: their largest difference)."""
        request = EmbedRequest(request_id=_copy_id(plan), input_ids=ids)
        compare = policy.compare_scores if plan.scores else policy.compare_embeddings

        async def run() -> Agreement:
            result = await self._workers.embed(plan.candidate.pool, request, self._terms)
            vectors = np.frombuffer(result.data, "<f4").reshape(len(ids), result.dimensions)
            return compare(primary, vectors)

        self._send(plan, request.request_id, run, took_s)

    def infer(self, plan: Plan, message: InferRequest, primary: InferResult, rows: int,
              took_s: float) -> None:  # fmt: skip
        """Copy a tensor request; the largest difference over the outputs."""
        request = msgspec.structs.replace(message, request_id=_copy_id(plan))

        async def run() -> Agreement:
            result = await self._workers.infer(plan.candidate.pool, request, self._terms, rows)
            return policy.compare_tensors(_arrays(primary.outputs), _arrays(result.outputs))

        self._send(plan, request.request_id, run, took_s)

    def generate(self, plan: Plan, request: GenerateRequest, tokens: list[int],
                 took_s: float) -> None:  # fmt: skip
        """Copy a greedy generation (as many tokens as the primary made: a stop string cut it
        there); exact match of the tokens. Sampled generations are counted, not copied."""
        if request.temperature != 0 or not tokens:
            plan.stats.skip()
            return
        copy = msgspec.structs.replace(request, request_id=_copy_id(plan), max_tokens=len(tokens))

        async def run() -> Agreement:
            made: list[int] = []
            async for chunk in self._workers.generate(plan.candidate.pool, copy, self._terms):
                made.extend(chunk.token_ids)
            return policy.compare_tokens(tokens, made)

        self._send(plan, copy.request_id, run, took_s)

    def _send(self, plan: Plan, copy_id: str, run: Callable[[], Awaitable[Agreement]],
              took_s: float) -> None:  # fmt: skip
        stats, pool = plan.stats, plan.candidate.pool
        slots, in_flight, queued = self._pools.load(pool)
        _, _, primary_queued = self._pools.load(plan.primary)
        load = CandidateLoad(slots, in_flight, queued, len(self._tasks),
                             self._busy.get(plan.primary, 0.0), primary_queued)  # fmt: skip
        reason = policy.drop_reason(load, self._limits)
        if reason is not None:
            stats.drop(reason)
            DROPPED.labels(stats.model, stats.candidate, reason.value).inc()
            return
        stats.sent()
        MIRRORED.labels(stats.model, stats.candidate).inc()
        task = asyncio.get_running_loop().create_task(
            self._copy(stats, copy_id, run, took_s), context=contextvars.Context()
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _copy(self, stats: ShadowStats, copy_id: str,
                    run: Callable[[], Awaitable[Agreement]], took_s: float) -> None:  # fmt: skip
        structlog.contextvars.bind_contextvars(request_id=copy_id)  # this task's context only
        started = time.perf_counter()
        try:
            found = await run()
        except Exception as exc:  # an error of the candidate's is a figure, not a failure here
            stats.fail()
            FAILED.labels(stats.model, stats.candidate).inc()
            log.info("shadow copy failed", model=stats.model, candidate=stats.candidate,
                     error=str(exc))  # fmt: skip
            return
        stats.record(found, took_s, time.perf_counter() - started)
        COMPARED.labels(stats.model, stats.candidate, str(found.agrees).lower()).inc()

    def start(self, sessions: async_sessionmaker[AsyncSession], every_s: float = 5.0) -> None:
        """Persist the reports that changed every ``every_s`` seconds (the admin API of any
        gateway, and the CLI, read them)."""
        self._sessions = sessions
        self._saver = asyncio.get_running_loop().create_task(self._save_loop(sessions, every_s))

    async def _save_loop(self, sessions: async_sessionmaker[AsyncSession], every_s: float) -> None:
        while True:
            await asyncio.sleep(every_s)
            try:
                await self.save(sessions)
            except Exception:  # the next round tries again
                log.exception("saving shadow reports failed")

    def reports(self) -> list[ShadowReport]:
        """This gateway's live reports, one per (model, candidate)."""
        return [s.report(self.gateway) for s in self.stats.values()]

    async def save(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        """Persist this gateway's reports if any has news since the last save (all of them: an
        idle pair's row stays fresh while its gateway lives, ``services.STALE_AFTER``)."""
        changed = [s for s in self.stats.values() if s.changed]
        if not changed:
            return
        for s in changed:  # before the write: a copy recorded meanwhile marks it again
            s.changed = False
        try:
            async with sessions.begin() as session:
                await persist(session, self.reports())
        except BaseException:  # not written: the next round writes them
            for s in changed:
                s.changed = True
            raise

    async def stop(self) -> None:
        """Stop saving (a last save first) and cancel the copies in flight (at shutdown)."""
        if self._saver is not None:
            self._saver.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._saver
            try:
                if self._sessions is not None:
                    await self.save(self._sessions)
            except Exception:  # shutting down: the report is this gateway's, in memory
                log.exception("saving shadow reports failed")
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task


def _copy_id(plan: Plan) -> str:
    return f"shadow_{os.urandom(8).hex()}_{plan.candidate.version}"


def _arrays(tensors: list[Tensor]) -> dict[str, np.ndarray]:
    """Each output's numbers; a ``BYTES`` output's raw bytes (equal when its strings are)."""
    return {
        t.name: np.frombuffer(t.data, "|u1")
        if t.datatype == BYTES
        else np.frombuffer(t.data, DATATYPES[t.datatype]).reshape(t.shape)
        for t in tensors
        if t.datatype in DATATYPES or t.datatype == BYTES
    }
