"""`simulate` (the deterministic network simulator) and the derived views: `owed`,
`claims`, `presence`.

`simulate` exits 0 when every run kept every invariant and met the scenario's targets,
1 otherwise (the failing seeds and violations are printed), so CI can run it as is.
"""

from __future__ import annotations

import re
import sys
from typing import Any

import click

from logsync import views
from logsync.cli._common import (
    EXIT_ERROR,
    create_option,
    emit_json,
    event_line,
    fail,
    handles_errors,
    json_option,
    open_store,
)
from logsync.cli.group import cli

_SEEDS_RE = re.compile(r"^\s*(\d+)\s*\.\.\s*(\d+)\s*$")
MAX_SWEEP = 10_000


def parse_seeds(raw: str) -> range:
    """`A..B`, inclusive, as a range; one sentence on anything else."""
    match = _SEEDS_RE.match(raw)
    if not match or int(match.group(1)) > int(match.group(2)):
        raise click.BadParameter(f"{raw!r} must be A..B with integers 0 <= A <= B, e.g. 1..20",
                                 param_hint="--seeds")
    first, last = int(match.group(1)), int(match.group(2))
    if last - first + 1 > MAX_SWEEP:
        raise click.BadParameter(f"{raw!r} spans {last - first + 1} seeds; at most {MAX_SWEEP}",
                                 param_hint="--seeds")
    return range(first, last + 1)


@cli.command()
@click.argument("scenario_file", metavar="SCENARIO.toml", type=click.Path(dir_okay=False))
@click.option("--seed", type=click.IntRange(min=0), default=None,
              help="Run this seed (default: the scenario's `seed`).")
@click.option("--seeds", default=None, metavar="A..B",
              help="Sweep seeds A to B inclusive and summarise.")
@click.option("--variant", default=None, help="Run the scenario's [variants.NAME] settings.")
@click.option("--plot", "plot_file", default=None, type=click.Path(dir_okay=False),
              metavar="FILE.png", help="Draw per-node lag over virtual time (one seed).")
@click.option("--trace", "trace_file", default=None, type=click.Path(dir_okay=False),
              metavar="FILE", help="Write the full trace (one seed).")
@json_option
@handles_errors
def simulate(scenario_file: str, seed: int | None, seeds: str | None, variant: str | None,
             plot_file: str | None, trace_file: str | None, as_json: bool) -> None:
    """Run a scenario over a virtual network with the real engine and store.

    Example:

    \b
      logsync simulate simulations/partition-and-heal.toml --seed 1 --plot partition.png
    """
    from logsync.sim import load_scenario, run_scenario, summarise
    from logsync.sim.report import summary_text

    if seed is not None and seeds is not None:
        raise click.UsageError("pass --seed or --seeds, not both")
    sweep = parse_seeds(seeds) if seeds is not None else None
    if sweep is not None and (plot_file or trace_file):
        raise click.UsageError("--plot and --trace draw one run; pass --seed, not --seeds")
    scenario = load_scenario(scenario_file, variant=variant)
    if sweep is None:
        one = scenario if seed is None else scenario.with_seed(seed)
        report = _run_one(one, trace_file, run_scenario)
        if plot_file:
            from logsync.sim.plot import plot_lag

            plot_lag(report, plot_file)
        if as_json:
            emit_json(report.as_dict() | ({"plot": plot_file} if plot_file else {}))
        else:
            click.echo(report.text())
            if plot_file:
                click.echo(f"  plot written to {plot_file}")
        good = report.ok and report.targets_met()
    else:
        reports = []
        for number in sweep:
            reports.append(run_scenario(scenario.with_seed(number)))
            if not as_json and sys.stderr.isatty():
                click.echo(f"\r  seed {number}: {'ok' if reports[-1].ok else 'FAILED'}",
                           err=True, nl=False)
        summary = summarise(reports)
        if as_json:
            emit_json(summary)
        else:
            if sys.stderr.isatty():
                click.echo("", err=True)
            click.echo(summary_text(summary, scenario.name))
        good = not summary["failed_seeds"] and not summary["targets_missed_seeds"]
    if not good:
        sys.exit(EXIT_ERROR)


def _run_one(scenario: Any, trace_file: str | None, run: Any) -> Any:
    if trace_file is None:
        return run(scenario)
    with open(trace_file, "w", encoding="utf-8") as sink:
        return run(scenario, trace_sink=sink)


@cli.command()
@click.option("--agent", required=True, help="The agent, e.g. pi@laptop.")
@create_option
@json_option
@click.pass_context
@handles_errors
def owed(ctx: click.Context, agent: str, as_json: bool) -> None:
    """Asks this agent still owes a reply to (RFC 003 §3.3, ordered by HLC).

    Example:

    \b
      logsync owed --agent codex@desk
    """
    if not agent.strip():
        fail("--agent must name an agent, e.g. pi@laptop", as_json)
    with open_store(ctx, read_only=True) as store:
        items = views.owed(store.iter_events(), agent)
    if as_json:
        emit_json({"agent": agent, "owed": items, "count": len(items)})
        return
    if not items:
        click.echo(f"{agent} owes nothing.")
        return
    click.echo(f"{agent} owes {len(items)} repl{'y' if len(items) == 1 else 'ies'}:")
    for event in items:
        click.echo(event_line(event))


@cli.command()
@click.argument("correlation_id")
@create_option
@json_option
@click.pass_context
@handles_errors
def claims(ctx: click.Context, correlation_id: str, as_json: bool) -> None:
    """Claims on a correlation id and the winner: the earliest claim by HLC (R3).

    Example:

    \b
      logsync claims task-42 --json
    """
    with open_store(ctx, read_only=True) as store:
        result = views.claims(store.iter_events(), correlation_id)
    if as_json:
        emit_json(result | {"count": len(result["claims"])})
        return
    winner = result["winner"]
    if winner is None:
        click.echo(f"No claims on {correlation_id}.")
        return
    click.echo(f"{correlation_id}: won by {winner['from_agent']} ({winner['id']}, "
               f"hlc {winner['hlc']}); {len(result['claims'])} claimant(s):")
    for event in result["claims"]:
        click.echo(event_line(event))


@cli.command()
@create_option
@json_option
@click.pass_context
@handles_errors
def presence(ctx: click.Context, as_json: bool) -> None:
    """Every agent and the newest event it wrote, by HLC (R5).

    Example:

    \b
      logsync presence
    """
    with open_store(ctx, read_only=True) as store:
        seen = views.presence(store.iter_events())
    if as_json:
        emit_json({"agents": list(seen.values()), "count": len(seen)})
        return
    if not seen:
        click.echo("No agents have written anything.")
        return
    width = max(len(agent) for agent in seen)
    for agent, info in seen.items():
        click.echo(f"  {agent:<{width}}  last seen {info['last_seen_at']}  {info['type']}  "
                   f"{info['event_id']}  ({info['events']} events)")
