"""``kiln models rollout``: start a canary's automatic rollout, show it, or abort it
(registered on the ``models`` group by ``cli.models``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click
import msgspec

from kiln_platform.cli._base import cli_actor, run_or_fail

if TYPE_CHECKING:
    from kiln_platform.db.database import Database
    from kiln_platform.registry.schemas import RolloutStart, RolloutView
    from kiln_platform.settings import Settings


@click.command("rollout")
@click.argument("name")
@click.option("--canary", help="Start rolling this version out (else: show the rollout).")
@click.option("--steps", default="5,25,50,100", show_default=True,
              help="The canary's share at each step, ending at 100 (with --canary).")  # fmt: skip
@click.option("--split", type=click.Choice(["tenant", "request"]), default="tenant",
              show_default=True, help="Sticky per tenant, or each request drawn anew.")  # fmt: skip
@click.option("--min-requests", type=int, default=200, show_default=True,
              help="Canary requests per step before a promotion.")  # fmt: skip
@click.option("--min-seconds", type=float, default=60.0, show_default=True,
              help="Time per step before a promotion.")  # fmt: skip
@click.option("--alpha", type=float, default=0.05, show_default=True,
              help="The error test's false-alarm bound per step.")  # fmt: skip
@click.option("--abort", is_flag=True, help="Abort the running rollout (back to stable).")
@click.pass_context
def rollout(  # noqa: PLR0917 (one option each)
    ctx: click.Context, name: str, canary: str | None, steps: str, split: str,
    min_requests: int, min_seconds: float, alpha: float, abort: bool,
) -> None:  # fmt: skip
    """Start (--canary V), show, or abort (--abort) NAME's canary rollout; shown as JSON."""
    from kiln_platform.registry import rollouts

    starting = bool(canary) and not abort  # only a start reads the plan options
    data = _start(str(canary), steps, split, min_requests, min_seconds, alpha) if starting else None

    async def action(db: Database, settings: Settings) -> RolloutView:
        async with db.sessions.begin() as session:
            if abort:
                return await rollouts.abort_rollout(session, cli_actor(), name)
            if data is not None:
                return await rollouts.start_rollout(session, cli_actor(), name, data)
            return await rollouts.get_rollout(session, cli_actor(), name)

    shown = run_or_fail(ctx, action)
    click.echo(msgspec.json.format(msgspec.json.encode(shown), indent=2).decode())


def _start(  # noqa: PLR0917 (one option each)
    canary: str, steps: str, split: str, min_requests: int, min_seconds: float, alpha: float
) -> RolloutStart:
    """The rollout to start, validated (a bad option: click's usage error, exit status 2)."""
    from kiln_platform.registry.schemas import RolloutStart

    try:
        return msgspec.convert(
            {"canary_version": canary, "plan": {
                "steps": [int(s) for s in steps.split(",")], "split": split,
                "min_requests": min_requests, "min_seconds": min_seconds, "alpha": alpha}},
            RolloutStart,
        )  # fmt: skip
    except (ValueError, msgspec.ValidationError) as exc:
        raise click.BadParameter(str(exc)) from None
