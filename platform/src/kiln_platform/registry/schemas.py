"""Wire types of the model registry's routes and rollouts (msgspec)."""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

import msgspec

Version = Annotated[str, msgspec.Meta(min_length=1, max_length=64)]


class RouteUpdate(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A model's route: the stable version, and optionally a canary with its share of tenants."""

    stable_version: Version
    canary_version: Version | None = None
    canary_percent: Annotated[int, msgspec.Meta(ge=0, le=100)] = 0


class RouteView(msgspec.Struct, kw_only=True):
    """A model's route as served."""

    model: str
    stable_version: str
    canary_version: str | None = None
    canary_percent: int = 0
    routed: bool = True
    """False: no route is set, so ``stable_version`` is the default one that serves, the newest
    active or deprecated version (empty when the model has none)."""


AliasName = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$")]


class AliasUpdate(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``PUT /admin/v1/models/{name}/aliases/{alias}``: the version the alias names."""

    version: Version


class AliasView(msgspec.Struct, kw_only=True):
    """One alias: ``model@alias`` answers from ``version``."""

    model: str
    alias: str
    version: str


class PinUpdate(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``PUT /admin/v1/models/{name}/pins/{tenant_id}``: what the tenant's plain ``model`` gets."""

    target: Version
    """A version, an alias, ``stable`` or ``canary``."""


class PinView(msgspec.Struct, kw_only=True):
    """One tenant's pin: its requests for ``model`` answer from ``target``."""

    model: str
    tenant_id: uuid.UUID
    target: str


Percent = Annotated[int, msgspec.Meta(ge=1, le=100)]


class RolloutPlan(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """How a canary is rolled out: its steps, each step's minimum, and the bounds it must keep.

    ``registry.rollout_policy.decide`` reads it; ``registry.sequential`` is the error test."""

    steps: Annotated[list[Percent], msgspec.Meta(min_length=2, max_length=20)] = msgspec.field(
        default_factory=lambda: [5, 25, 50, 100]
    )
    """The canary's share at each step, increasing, ending at 100 (the canary made stable)."""
    split: Literal["tenant", "request"] = "tenant"
    """``tenant``: sticky per tenant, as routes are; ``request``: each request drawn anew."""
    min_requests: Annotated[int, msgspec.Meta(ge=1)] = 200
    """Canary requests a step must see before it may be promoted."""
    min_seconds: Annotated[float, msgspec.Meta(ge=0)] = 60.0
    """Time a step must last before it may be promoted."""
    alpha: Annotated[float, msgspec.Meta(gt=0, lt=0.5)] = 0.05
    """The sequential test's false-alarm bound (per step)."""
    error_ratio: Annotated[float, msgspec.Meta(gt=1)] = 2.0
    """The test's alternative: the canary fails this many times as often as the stable."""
    max_error_excess: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.01
    """At a step's end: the canary's error rate may exceed the stable's by at most this."""
    max_latency_ratio: Annotated[float, msgspec.Meta(ge=1)] = 1.5
    """At a step's end: canary p99 latency (TTFT for generation) over the stable's, at most."""
    max_degenerate_excess: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.05
    """At a step's end (generation): the excess share of empty or length-truncated outputs."""
    progress_deadline_s: Annotated[float, msgspec.Meta(gt=0)] = 600.0
    """A step whose canary drew requests but served none for this long (its pool never ready,
    never crashed: no capacity, a load that hangs) rolls back, as Flagger's progress deadline."""


class RolloutStart(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``PUT /admin/v1/models/{name}/rollout``: the canary version and its plan."""

    canary_version: Version
    plan: RolloutPlan = msgspec.field(default_factory=RolloutPlan)


class RolloutDecision(msgspec.Struct, kw_only=True):
    """One decision of a rollout, with the figures it was made on."""

    at: str
    action: str
    """``start``, ``promote``, ``complete``, ``rollback`` or ``abort``."""
    step: int
    """The share (percent) the step that ended had."""
    reason: str
    figures: dict[str, Any] = msgspec.field(default_factory=dict)


class RolloutView(msgspec.Struct, kw_only=True):
    """A rollout: its state, current step, plan, worst-case failures and decision history."""

    id: uuid.UUID
    model: str
    stable_version: str
    canary_version: str
    state: str
    """``running``, ``completed``, ``rolled_back`` or ``aborted``."""
    percent: int
    """The canary's current share (0 once rolled back, 100 once completed)."""
    step_started_at: str
    plan: RolloutPlan
    failure_bound: int
    """With a stable version that does not fail, the most canary failures the sequential test
    lets through over the whole rollout, before requests in flight (``rollout_policy``)."""
    history: list[RolloutDecision]
