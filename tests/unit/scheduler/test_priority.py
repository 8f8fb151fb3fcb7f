"""Priority classes: interactive first, batch keeps a bounded minimum share."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from kiln_platform.scheduler.policy import PolicyConfig, PoolQueue
from kiln_platform.scheduler.schemas import Credit, Priority

if TYPE_CHECKING:
    from tests.unit.scheduler.conftest import MakeRequest, Saturate


def by_name(tenant: str) -> Priority:
    return Priority.BATCH if tenant.startswith("batch") else Priority.INTERACTIVE


def test_batch_gets_its_minimum_share_when_both_are_backlogged(
    saturate: Saturate,
) -> None:
    served = saturate([("chat", 1.0, 1.0), ("batch", 1.0, 1.0)], 2000, priority=by_name)
    assert served["batch"] / 2000 == pytest.approx(0.10, abs=0.01)


@pytest.mark.parametrize("batch_share", [0.05, 0.25])
def test_batch_share_is_a_knob(saturate: Saturate, batch_share: float) -> None:
    config = PolicyConfig(batch_share=batch_share)
    served = saturate(
        [("chat", 1.0, 1.0), ("batch", 1.0, 1.0)], 2000, config=config, priority=by_name
    )
    assert served["batch"] / 2000 == pytest.approx(batch_share, abs=0.01)


def test_batch_takes_everything_when_interactive_is_idle(
    saturate: Saturate,
) -> None:
    served = saturate([("batch-a", 1.0, 1.0), ("batch-b", 3.0, 1.0)], 400, priority=by_name)
    assert served["batch-b"] / 400 == pytest.approx(0.75, abs=0.05)


def test_interactive_jumps_a_batch_backlog(make_request: MakeRequest) -> None:
    queue = PoolQueue()
    for _ in range(1000):
        queue.push(make_request("batch", priority=Priority.BATCH))
    for _ in range(50):
        queue.next_dispatch(0.0, [Credit("w", 1)])
    chat = make_request("chat")
    queue.push(chat)
    got, _ = queue.next_dispatch(0.0, [Credit("w", 2)])
    assert chat in [d.request for d in got]


def test_interactive_is_served_mostly_first(make_request: MakeRequest) -> None:
    queue = PoolQueue()
    for _ in range(100):
        queue.push(make_request("batch", priority=Priority.BATCH))
        queue.push(make_request("chat"))
    got, _ = queue.next_dispatch(0.0, [Credit("w", 100)])
    assert sum(d.request.priority is Priority.INTERACTIVE for d in got) >= 89


def test_classes_share_tenant_accounting_separately(make_request: MakeRequest) -> None:
    queue = PoolQueue()  # the same tenant may use both classes
    queue.push(make_request("t", priority=Priority.BATCH))
    queue.push(make_request("t"))
    got, _ = queue.next_dispatch(0.0, [Credit("w", 1)])
    assert got[0].request.priority is Priority.INTERACTIVE


@pytest.mark.parametrize("batch_share", [0.0, 1.0, -0.1])
def test_batch_share_must_leave_both_classes_something(batch_share: float) -> None:
    with pytest.raises(ValueError, match="batch_share"):
        PolicyConfig(batch_share=batch_share)
