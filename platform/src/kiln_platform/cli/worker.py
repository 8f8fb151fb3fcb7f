"""``kiln worker`` (one runtime worker) and ``kiln simulate`` (the scheduler, offline)."""

from __future__ import annotations

from pathlib import Path

import click

from kiln_platform.cli._base import fail


@click.command(
    add_help_option=False,  # `kiln worker --help` shows the worker's own options
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def worker(args: tuple[str, ...]) -> None:
    """Run one runtime worker (same as ``python -m kiln_runtimes``)."""
    from kiln_runtimes.worker import main as worker_main

    worker_main(list(args))


@click.command()
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--only", multiple=True, help="Simulate only this tenant (repeatable).")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="Override a field.")
@click.option("--baseline", is_flag=True, help="Also run each tenant alone; print the p99 ratio.")
def simulate(
    path: Path, seed: int, only: tuple[str, ...], sets: tuple[str, ...], baseline: bool
) -> None:
    """Simulate the scheduler on a synthetic or recorded trace (docs/scheduler.md)."""
    from kiln_platform.scheduler.simulate import format_report, parse_override, run_simulation

    try:
        overrides = dict(parse_override(s) for s in sets)
        report = run_simulation(
            path, seed=seed, only=set(only) or None, overrides=overrides, baseline=baseline
        )
    except (ValueError, OSError) as exc:  # malformed files, TOML syntax included
        fail(exc)
    click.echo(format_report(report))
