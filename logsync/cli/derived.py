"""The views derived from the log (RFC 003 §3.3): `owed`, `claims`, `presence`. Read-only:
each opens the store for reading and folds its events (`logsync/views.py`)."""

from __future__ import annotations

import time

import click

from logsync import views
from logsync.cli._common import (
    create_option,
    emit_json,
    event_line,
    fail,
    handles_errors,
    json_option,
    open_store,
)
from logsync.cli.group import cli
from logsync.errors import shorten
from logsync.model import utc_now_iso


@cli.command()
@click.option("--agent", required=True, help="The agent, e.g. pi@laptop.")
@click.option("--now", "now", default=None, help="Judge expiry at this UTC time instead of "
              "the clock's. Example: --now 2026-12-01T12:00:00Z")
@create_option
@json_option
@click.pass_context
@handles_errors
def owed(ctx: click.Context, agent: str, now: str | None, as_json: bool) -> None:
    """Asks this agent still owes a reply to (RFC 003 §3.3, ordered by HLC); an ask whose
    metadata.expires_at has passed is listed apart, as expired, not to act on (R2).

    Example:

    \b
      logsync owed --agent codex@desk
    """
    if not agent.strip():
        fail("--agent must name an agent, e.g. pi@laptop", as_json)
    if now is not None and not views.is_utc_stamp(now):
        fail(f"--now {shorten(now)} is not a real UTC time like 2026-12-01T12:00:00Z",
             as_json)
    with open_store(ctx, read_only=True) as store:
        items = views.owed(store.iter_events(), agent)
    live, expired = views.split_expired(items, now or utc_now_iso(int(time.time() * 1000)))
    unreadable = views.unreadable_expiry(live)
    if as_json:
        emit_json({"agent": agent, "owed": live, "count": len(live), "expired": expired,
                   "unreadable_expiry": unreadable})
        return
    if unreadable:
        click.echo(f"Note: {unreadable} of these asks carry an expires_at that is not a UTC "
                   "time like 2026-12-01T12:00:00Z, so they never expire", err=True)
    if not live:
        click.echo(f"{agent} owes nothing.")
    else:
        click.echo(f"{agent} owes {len(live)} repl{'y' if len(live) == 1 else 'ies'}:")
    for event in live:
        click.echo(event_line(event))
    if expired:
        click.echo(f"expired, not to act on ({len(expired)}):")
        for event in expired:
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
    if result["must_yield"]:
        losers = ", ".join(str(e.get("from_agent")) for e in result["must_yield"])
        click.echo(f"still to yield (write status superseded on {correlation_id}): {losers}")


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
