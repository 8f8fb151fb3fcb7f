"""The pools' recent refusals the shed gate repeats: held for the pool's retry time (at most
``MAX_HELD_S``), only 429/503 with a retry time, per tenant, model and class, for deadlines no
longer than the refused request's, and bounded in number."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from kiln_platform.admission.shed import MAX_HELD_S, RecentRefusals
from kiln_platform.errors import DeadlineExceeded, Overloaded, ServiceUnavailable
from kiln_platform.scheduler.schemas import Priority

INTER, BATCH = Priority.INTERACTIVE, Priority.BATCH


def _at(monkeypatch: pytest.MonkeyPatch, now: float) -> None:
    """The refusals' clock reads ``now``."""
    monkeypatch.setattr("kiln_platform.admission.shed.time", SimpleNamespace(monotonic=lambda: now))


def test_a_refusal_is_repeated_with_what_is_left_of_its_retry_time() -> None:
    held = RecentRefusals()
    held.hold(
        ("t", "m", INTER), 2.0, ServiceUnavailable("The pool is overloaded.", retry_after=0.5)
    )
    again = held.refusal("t", "m", INTER, 2.0)
    assert isinstance(again, ServiceUnavailable)
    assert again.message == "The pool is overloaded."
    assert again.retry_after is not None
    assert 0.4 < again.retry_after <= 0.5


def test_only_the_same_tenant_model_and_class_with_no_longer_deadline_meet_it() -> None:
    held = RecentRefusals()
    held.hold(("t", "m", INTER), 2.0, Overloaded("Over share.", retry_after=0.5))
    assert held.refusal("t", "m", INTER, 1.0) is not None
    assert held.refusal("t", "m", INTER, 2.5) is None
    assert held.refusal("u", "m", INTER, 1.0) is None
    assert held.refusal("t", "n", INTER, 1.0) is None
    assert held.refusal("t", "m", BATCH, 1.0) is None


def test_refusals_without_a_retry_time_or_deadline_are_not_held() -> None:
    held = RecentRefusals()
    held.hold(("t", "m", INTER), 2.0, DeadlineExceeded("Too short."))
    held.hold(("t", "m", INTER), 2.0, Overloaded("Over share."))
    held.hold(("t", "m", INTER), None, Overloaded("Over share.", retry_after=1.0))
    assert not held


def test_a_refusal_expires_and_is_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    held = RecentRefusals()
    held.hold(("t", "m", INTER), 2.0, Overloaded("Over share.", retry_after=60.0))
    later = time.monotonic() + MAX_HELD_S + 0.01
    monkeypatch.setattr(
        "kiln_platform.admission.shed.time", SimpleNamespace(monotonic=lambda: later)
    )
    assert held.refusal("t", "m", INTER, 2.0) is None
    assert not held


def test_the_held_refusals_stay_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("kiln_platform.admission.shed.MAX_ENTRIES", 8)
    held = RecentRefusals()
    now = time.monotonic()
    for i in range(8):
        held.hold(("t", f"m{i}", INTER), 2.0, Overloaded("Over share.", retry_after=0.1))
    monkeypatch.setattr(
        "kiln_platform.admission.shed.time", SimpleNamespace(monotonic=lambda: now + 0.2)
    )
    held.hold(("t", "new", INTER), 2.0, Overloaded("Over share.", retry_after=0.1))
    assert len(held) == 1


def test_once_every_refusal_ended_none_is_held(monkeypatch: pytest.MonkeyPatch) -> None:
    """The gate's fast path (no refusal held) comes back without a request asking each one."""
    held = RecentRefusals()
    now = time.monotonic()
    held.hold(("t", "m", INTER), 2.0, Overloaded("Over share.", retry_after=0.2))
    held.hold(("t", "n", INTER), 2.0, Overloaded("Over share.", retry_after=0.5))
    monkeypatch.setattr(
        "kiln_platform.admission.shed.time", SimpleNamespace(monotonic=lambda: now + 0.3)
    )
    assert held
    monkeypatch.setattr(
        "kiln_platform.admission.shed.time", SimpleNamespace(monotonic=lambda: now + 0.6)
    )
    assert not held
    assert len(held) == 0
