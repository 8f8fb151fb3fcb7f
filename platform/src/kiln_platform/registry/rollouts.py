"""Rollouts: a canary version taken step by step to 100 % of a model's traffic, or rolled back.

Platform-admin only (resource ``model-rollouts``), audited as ``model.rollout``; the decisions
(``registry.rollout_monitor``) are audited as ``model.rollout.decision`` by ``system:rollouts``.
While a rollout runs it owns the model's route: setting the route by hand is refused.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import msgspec
from sqlalchemy import select
from sqlalchemy.dialects.postgresql import distinct_on

from kiln_platform.admin.authz import Actor, Role, require
from kiln_platform.audit.services import record
from kiln_platform.db import after_commit
from kiln_platform.db.tables import Model, ModelRoute
from kiln_platform.errors import BadRequest, Conflict, NotFound
from kiln_platform.registry.rollout_policy import failure_bound
from kiln_platform.registry.schemas import (
    RolloutDecision,
    RolloutPlan,
    RolloutStart,
    RolloutView,
)
from kiln_platform.registry.services import (
    default_version,
    find_model,
    running,
    version_state,
    write_route,
)
from kiln_platform.registry.tables import ModelRollout

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from sqlalchemy.ext.asyncio import AsyncSession

RESOURCE = "model-rollouts"
SYSTEM = Actor("system:rollouts", Role.PLATFORM_ADMIN, None, source="rollout-monitor")
"""Who the monitor's decisions are audited as."""


def check_plan(plan: RolloutPlan) -> None:
    """Steps strictly increase and end at 100 (400 naming ``plan.steps`` otherwise)."""
    steps = plan.steps
    if any(a >= b for a, b in itertools.pairwise(steps)) or steps[-1] != 100:
        raise BadRequest("Steps must increase and end at 100.", param="plan.steps")


async def start_rollout(
    session: AsyncSession, actor: Actor, name: str, data: RolloutStart,
    *, reconcile: Callable[[], Awaitable[object]] | None = None,
) -> RolloutView:  # fmt: skip
    """Start rolling ``data.canary_version`` out against the route's stable version (or the one
    serving without a route): the route gets the canary at the first step's share."""
    require(actor, RESOURCE, write=True)
    check_plan(data.plan)
    model = await find_model(session, name)
    await version_state(session, model, data.canary_version, "canary_version")
    if await running(session, model.id) is not None:
        raise Conflict(f"A rollout of `{name}` is running; DELETE it first.")
    stable = await _stable(session, model, data.canary_version)
    if stable == data.canary_version:
        raise BadRequest("The canary must be another version than the stable one.",
                         param="canary_version")  # fmt: skip
    now = datetime.now(UTC)
    rollout = ModelRollout(
        model_id=model.id, stable_version=stable, canary_version=data.canary_version,
        plan=msgspec.to_builtins(data.plan), state="running", step=0, step_started_at=now,
        created_by=actor.name,
        history=[entry(now, "start", 0, f"started by {actor.name}", {})],
    )  # fmt: skip
    session.add(rollout)
    await session.flush()
    await write_route(session, model.id, stable, data.canary_version, data.plan.steps[0],
                    data.plan.split)  # fmt: skip
    await record(session, actor, "model.rollout", "model", model.id, None,
                 after={"rollout": str(rollout.id), "stable_version": stable,
                        "canary_version": data.canary_version,
                        "plan": msgspec.to_builtins(data.plan)})  # fmt: skip
    if reconcile is not None:
        after_commit.defer(session, reconcile)
    return view(name, rollout)


async def get_rollout(session: AsyncSession, actor: Actor, name: str) -> RolloutView:
    """The model's newest rollout: its state, step and decision history."""
    require(actor, RESOURCE)
    model = await find_model(session, name)
    rollout = await session.scalar(
        select(ModelRollout).where(ModelRollout.model_id == model.id)
        .order_by(ModelRollout.created_at.desc()).limit(1)
    )  # fmt: skip
    if rollout is None:
        raise NotFound(f"`{name}` has no rollout.", param="name")
    return view(name, rollout)


async def latest_rollouts(session: AsyncSession, actor: Actor) -> dict[str, RolloutView]:
    """Each model's newest rollout, by model name (the console's models page)."""
    require(actor, RESOURCE)
    rows = await session.execute(
        select(Model.name, ModelRollout).join(Model, Model.id == ModelRollout.model_id)
        .order_by(Model.name, ModelRollout.created_at.desc())
        .ext(distinct_on(Model.name))
    )  # fmt: skip
    return {name: view(name, rollout) for name, rollout in rows.all()}


async def abort_rollout(
    session: AsyncSession, actor: Actor, name: str,
    *, reconcile: Callable[[], Awaitable[object]] | None = None,
) -> RolloutView:  # fmt: skip
    """Abort the running rollout: every request goes back to the stable version (409 if the
    newest rollout is over already)."""
    require(actor, RESOURCE, write=True)
    model = await find_model(session, name)
    rollout = await running(session, model.id, lock=True)
    if rollout is None:
        await get_rollout(session, actor, name)  # 404 if it never had one
        raise Conflict(f"The rollout of `{name}` is over; nothing to abort.")
    now = datetime.now(UTC)
    finish(rollout, "aborted", now, entry(now, "abort", percent(rollout),
                                          f"aborted by {actor.name}", {}))  # fmt: skip
    await write_route(session, model.id, rollout.stable_version, None, 0, "tenant")
    await record(session, actor, "model.rollout", "model", model.id, None,
                 before={"rollout": str(rollout.id), "state": "running"},
                 after={"rollout": str(rollout.id), "state": "aborted"})  # fmt: skip
    if reconcile is not None:
        after_commit.defer(session, reconcile)
    return view(name, rollout)


def entry(
    at: datetime, action: str, step: int, reason: str, figures: dict[str, Any]
) -> dict[str, Any]:
    """One decision as the history stores it."""
    return {"at": at.isoformat(), "action": action, "step": step, "reason": reason,
            "figures": figures}  # fmt: skip


def finish(rollout: ModelRollout, state: str, at: datetime, decision: dict[str, Any]) -> None:
    """End the rollout in ``state`` with its last decision."""
    rollout.state, rollout.finished_at = state, at
    rollout.history = [*rollout.history, decision]


def percent(rollout: ModelRollout) -> int:
    """The canary's share now: the step's while running, 100 once completed, else 0."""
    if rollout.state == "running":
        return int(rollout.plan["steps"][rollout.step])
    return 100 if rollout.state == "completed" else 0


def view(name: str, rollout: ModelRollout) -> RolloutView:
    plan = msgspec.convert(rollout.plan, RolloutPlan)
    return RolloutView(
        id=rollout.id, model=name, stable_version=rollout.stable_version,
        canary_version=rollout.canary_version, state=rollout.state, percent=percent(rollout),
        step_started_at=rollout.step_started_at.isoformat(), plan=plan,
        failure_bound=failure_bound(plan),
        history=[msgspec.convert(h, RolloutDecision) for h in rollout.history],
    )  # fmt: skip


async def _stable(session: AsyncSession, model: Model, canary: str) -> str:
    """The version the rollout starts from: the route's stable, else the default one
    (``services.default_version``) but the canary."""
    route = await session.get(ModelRoute, model.id)
    if route is not None:
        return route.stable_version
    default = await default_version(session, model.id, but=canary)
    if default is None:
        raise BadRequest(f"`{model.name}` has no active version to roll out against.")
    return default
