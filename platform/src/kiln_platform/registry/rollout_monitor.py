"""The rollout monitor: every tick (``KILN_ROLLOUT_INTERVAL_S``, 1 s, and at once after a
canary's server error) each gateway stores its counts of the running rollouts' steps; then one
gateway at a time (an advisory lock, like the SLO monitor) decides each rollout
(``rollout_policy.decide``) and applies the decision: the route moves, the decision goes into
the rollout's history and the audit log, and an alert event is stored for the receivers
(rollback: ``KilnCanaryRolledBack`` firing; promotion, completion: ``KilnCanaryRollout``, an
info event), delivered at once by the SLO monitor's delivery."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import msgspec
import structlog
from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert

from kiln_platform.audit.services import record
from kiln_platform.db.tables import Model
from kiln_platform.registry import rollouts, services
from kiln_platform.registry.outcomes import RolloutOutcomes, Watched
from kiln_platform.registry.rollout_policy import Action, Arm, Decision, decide
from kiln_platform.registry.schemas import RolloutPlan
from kiln_platform.registry.tables import ModelRollout, RolloutCount
from kiln_platform.slo import notify
from kiln_platform.slo.tables import Alert

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

ROLLOUT_LOCK = 0x6B696C6E_726F6C6C  # pg_try_advisory_xact_lock key: "kiln" "roll"
ROLLED_BACK, EVENT = "KilnCanaryRolledBack", "KilnCanaryRollout"
log = structlog.get_logger("kiln.rollouts")


class RolloutMonitor:
    """Counts, decides and applies the running rollouts in the background."""

    def __init__(
        self, sessions: async_sessionmaker[AsyncSession], outcomes: RolloutOutcomes,
        interval_s: float, reconcile: Callable[[], Awaitable[object]],
        deliver: Callable[[], Awaitable[object]],
    ) -> None:  # fmt: skip
        self._sessions = sessions
        self.outcomes = outcomes
        self._interval_s = interval_s
        self._reconcile = reconcile
        """The pool manager's: this gateway routes by the new route at once."""
        self._deliver = deliver
        """The SLO monitor's delivery of due alert notifications."""
        self.gateway = uuid.uuid4()
        self._watched: set[tuple[uuid.UUID, int]] = set()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Watch the running rollouts, then tick in the background."""
        await self._load()
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        """Stop, storing the last counts."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        with contextlib.suppress(Exception):
            await self._flush()

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.outcomes.failed.wait(), self._interval_s)
            self.outcomes.failed.clear()
            try:
                await self.tick()
            except Exception:  # the next tick retries; counts stay in memory
                log.exception("rollout evaluation failed")

    async def tick(self) -> None:
        """Store this gateway's counts, decide (unless another gateway is), apply, re-watch.

        While the last look found no rollout running, no lock is taken and nothing decided:
        the re-watch finds a rollout another gateway started, and the next tick decides it."""
        await self._flush()
        decided = bool(self._watched) and await self._decide()
        await self._load(force=decided)  # the route first: the alert may take a while
        if decided:
            await self._deliver()

    async def _decide(self) -> bool:
        """Under the advisory lock, decide and apply every running rollout; whether any moved."""
        decided = False
        async with self._sessions.begin() as session:
            if await session.scalar(select(func.pg_try_advisory_xact_lock(ROLLOUT_LOCK))):
                rows = await session.execute(
                    select(ModelRollout, Model.name).join(Model, Model.id == ModelRollout.model_id)
                    .where(ModelRollout.state == "running").with_for_update(of=ModelRollout)
                )  # fmt: skip
                for rollout, name in rows.all():
                    decided |= await _evaluate(session, rollout, name)
        return decided

    async def reload(self) -> None:
        """Watch the running rollouts, then route by the stored routes (a rollout started or
        aborted here: its canary's requests are counted from the first)."""
        await self._load(force=True)

    async def _load(self, *, force: bool = False) -> None:
        """Watch the running rollouts' steps; a change (here or by another gateway's
        decision) reconciles the routes at once rather than at the 2 s refresh."""
        async with self._sessions() as session:
            rows = await session.execute(
                select(ModelRollout, Model.name).join(Model, Model.id == ModelRollout.model_id)
                .where(ModelRollout.state == "running")
            )  # fmt: skip
            watched = [Watched(r.id, name, r.step, r.stable_version, r.canary_version)
                       for r, name in rows.all()]  # fmt: skip
        self.outcomes.watch(watched)
        steps = {(w.rollout, w.step) for w in watched}
        if force or steps != self._watched:
            await self._reconcile()
        self._watched = steps

    async def _flush(self) -> None:
        counts = self.outcomes.snapshot()
        if not counts:
            return
        rows = [
            {"rollout_id": rid, "step": step, "gateway": self.gateway, "arm": arm,
             "total": a.total, "errors": a.errors, "degenerate": a.degenerate,
             "latency": a.latency}
            for (rid, step, arm), a in counts.items()
        ]  # fmt: skip
        stmt = insert(RolloutCount).values(rows)
        stmt = stmt.on_conflict_do_update(
            index_elements=["rollout_id", "step", "gateway", "arm"],
            set_={c: getattr(stmt.excluded, c) for c in ("total", "errors", "degenerate",
                                                          "latency")},
        )  # fmt: skip
        try:  # cumulative counts: the next tick stores them again
            async with self._sessions.begin() as session:
                await session.execute(stmt)
        except Exception:  # e.g. a rollout that just ended and was deleted
            log.warning("rollout counts not stored", exc_info=True)


async def step_arms(session: AsyncSession, rollout: ModelRollout) -> tuple[Arm, Arm, Arm]:
    """The current step's (canary, stable, deferred) counts, summed over every gateway."""
    arms = {"canary": Arm(), "stable": Arm(), "deferred": Arm()}
    rows = await session.scalars(
        select(RolloutCount).where(
            RolloutCount.rollout_id == rollout.id, RolloutCount.step == rollout.step
        )
    )
    for row in rows:
        arms[row.arm].add(Arm(row.total, row.errors, row.degenerate, list(row.latency)))
    return arms["canary"], arms["stable"], arms["deferred"]


async def _evaluate(session: AsyncSession, rollout: ModelRollout, name: str) -> bool:
    """Decide one rollout and apply the decision; whether anything changed."""
    plan = msgspec.convert(rollout.plan, RolloutPlan)
    canary, stable, deferred = await step_arms(session, rollout)
    now = datetime.now(UTC)
    decision = decide(plan, rollout.step, canary, stable,
                      (now - rollout.step_started_at).total_seconds(),
                      deferred=deferred.total)  # fmt: skip
    if decision.action is Action.HOLD:
        return False
    await apply(session, rollout, name, plan, decision, now)
    return True


async def apply(  # noqa: PLR0917 (a decision and what it is about)
    session: AsyncSession, rollout: ModelRollout, name: str, plan: RolloutPlan,
    decision: Decision, now: datetime,
) -> None:  # fmt: skip
    """Move the route, record the decision (history, audit log) and store its alert event."""
    item = rollouts.entry(now, str(decision.action), rollouts.percent(rollout), decision.reason,
                          decision.figures)  # fmt: skip
    if decision.action is Action.PROMOTE:
        rollout.step, rollout.step_started_at = rollout.step + 1, now
        rollout.history = [*rollout.history, item]
        await services.write_route(
            session, rollout.model_id, rollout.stable_version, rollout.canary_version,
            plan.steps[rollout.step], plan.split,
        )  # fmt: skip
    else:
        done = decision.action is Action.COMPLETE
        rollouts.finish(rollout, "completed" if done else "rolled_back", now, item)
        stable = rollout.canary_version if done else rollout.stable_version
        await services.write_route(session, rollout.model_id, stable, None, 0, "tenant")
    await record(session, rollouts.SYSTEM, "model.rollout.decision", "model", rollout.model_id,
                 None, after={"rollout": str(rollout.id), "model": name, **item})  # fmt: skip
    await _alert(session, rollout, name, item, now)
    log.info("rollout decision", model=name, rollout=str(rollout.id), action=item["action"],
             reason=decision.reason)  # fmt: skip


async def _alert(
    session: AsyncSession, rollout: ModelRollout, name: str, item: dict[str, Any], now: datetime
) -> None:
    """Rollback: a firing alert (page). Promotion, completion: an info event, sent resolved."""
    back = item["action"] == Action.ROLLBACK
    alertname = ROLLED_BACK if back else EVENT
    labels = {"alertname": alertname, "model": name, "stable_version": rollout.stable_version,
              "canary_version": rollout.canary_version, "action": item["action"],
              "severity": "page" if back else "info"}  # fmt: skip
    annotations = {
        "summary": f"Canary {name}@{rollout.canary_version}: {item['action']} at "
                   f"{item['step']} % ({item['reason']})",
        "rollout": str(rollout.id), "figures": msgspec.json.encode(item["figures"]).decode(),
    }  # fmt: skip
    fingerprint = f"rollout-{rollout.id}" + ("" if back else f"-{len(rollout.history)}")
    alert = Alert(
        fingerprint=fingerprint, name=alertname, status="firing" if back else "resolved",
        starts_at=now, ends_at=None if back else now, labels=labels, annotations=annotations,
    )  # fmt: skip
    session.add(alert)
    await notify.enqueue(session, alert)
