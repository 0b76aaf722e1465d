"""The operator's commands that change a ledger or the palace's identity (issue 11, item 6;
RFC 004 §10.5-10.6): `quarantine retry`, `conflicts review` and `reidentify`. Each is a local
decision: nothing here changes what other replicas hold (a retried op is applied as a
pulled one would be, and then served like any other)."""

from __future__ import annotations

from typing import Any

import click

from logsync.cli._common import (
    emit_json,
    handles_errors,
    has_palace,
    json_option,
    open_store,
    palace_of,
)
from logsync.cli.group import cli
from logsync.cli.ledgers import ORIGIN_HELP, checked_filters, conflicts_cmd, quarantine_cmd
from logsync.errors import NotFoundError, ValidationError
from logsync.store.retry import OriginRetry, RetryReport

HELD_SHOWN = 20  # held rows listed per origin in text (--json lists them all)


@quarantine_cmd.command("retry")
@click.option("--origin", default=None, help="Retry only this origin's held ops (a replica id).")
@json_option
@click.pass_context
@handles_errors
def quarantine_retry(ctx: click.Context, as_json: bool, origin: str | None) -> None:
    """Judge the held ops again with the rules that refused them, and apply those whose
    cause is gone (their artifact arrived, a validator was fixed), as a pulled op would
    be: an op is applied only when it is the next of its origin, so every origin stays a
    gap-free prefix. Applied ops leave the quarantine, as do ops now found held or
    recorded as a conflict; the rest stay, with their reason (new if it changed). An op
    a signed page refused is never applied here: the next pull proves it or not.

    Example:

    \b
      logsync quarantine retry --origin rep_0123456789abcdef0123456789abcdef --json
    """
    origin, _ = checked_filters(origin, None)
    with open_store(ctx, must_exist=True) as store:
        report = store.retry_quarantine(origin)
    if as_json:
        emit_json(report.to_json())
        return
    for line in retry_lines(report):
        click.echo(line)


def retry_lines(report: RetryReport) -> list[str]:
    """Per origin: the counts, then each op still held with its reason (bounded)."""
    if not report.origins:
        return ["no quarantined ops to retry"]
    lines = []
    for entry in report.origins:
        lines.append(_origin_line(entry))
        for held in entry.held[:HELD_SHOWN]:
            seq = "" if held.origin_seq is None else f"#{held.origin_seq} "
            wait = ("" if held.waits_for is None
                    else f"waits for origin_seq {held.waits_for}; ")
            lines.append(f"    [{held.row_id}] {seq}{wait}{_printable(held.reason)}")
        if len(entry.held) > HELD_SHOWN:
            lines.append(f"    ... and {len(entry.held) - HELD_SHOWN} more (--json lists all)")
    if report.truncated:
        lines.append("more ops are held than one retry looks at: run it again for the rest")
    return lines


def _origin_line(entry: OriginRetry) -> str:
    name = entry.origin or "(no usable origin)"
    return (f"{name}: retried {entry.retried}, applied {entry.applied}, already held "
            f"{entry.already_held}, conflicts {entry.conflicts}, still held {len(entry.held)}")


def _printable(text: str, limit: int = 200) -> str:
    """A reason on one terminal line: control characters escaped, cut to `limit`."""
    shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return shown if len(shown) <= limit else shown[: limit - 3] + "..."


@conflicts_cmd.command("review")
@click.argument("ids", nargs=-1, type=click.IntRange(1, 2**63 - 1))
@click.option("--all", "all_", is_flag=True,
              help="Mark every unreviewed conflict (those --origin and --kind select).")
@click.option("--origin", default=None, help=ORIGIN_HELP + " Only with --all.")
@click.option("--kind", default=None, help="Only conflicts of this kind. Only with --all.")
@json_option
@click.pass_context
@handles_errors
def conflicts_review(ctx: click.Context, as_json: bool, ids: tuple[int, ...], all_: bool,
                     origin: str | None, kind: str | None) -> None:
    """Mark conflicts reviewed (by their ids, as `logsync conflicts` shows them, or --all):
    they stay in the ledger, with the time of the mark, and stop counting as unreviewed.
    The same conflict seen again keeps its mark.

    Example:

    \b
      logsync conflicts review 12 13
      logsync conflicts review --all --kind restored_replica
    """
    if ids and all_:
        raise ValidationError("pass conflict ids or --all, not both")
    if not ids and not all_:
        raise ValidationError("name the conflicts to mark reviewed (their ids) or pass --all")
    if ids and (origin is not None or kind is not None):
        raise ValidationError("--origin and --kind select conflicts for --all: with ids, "
                              "leave them out")
    origin, kind = checked_filters(origin, kind)
    with open_store(ctx, must_exist=True) as store:
        done = store.review_conflicts(list(ids) if ids else None, origin=origin, kind=kind)
    if as_json:
        emit_json(done)
        return
    already = f" ({done['already_reviewed']} already were)" if done["already_reviewed"] else ""
    click.echo(f"marked {done['reviewed']} conflicts reviewed{already}")


@cli.command("reidentify")
@click.option("--yes", is_flag=True,
              help="Do it: without this flag the command only says what it would do.")
@json_option
@click.pass_context
@handles_errors
def reidentify(ctx: click.Context, as_json: bool, yes: bool) -> None:
    """Give this palace a new replica id and signing key: the remedy for a cloned palace
    (two copies of one directory author ops under one origin). Its ops so far stay under
    the old id, new ones go under the new id, and peers see a new origin. Stop `logsync
    serve` on this palace first: a running daemon keeps the old identity until restarted.

    Example:

    \b
      logsync reidentify --yes --json
    """
    if not yes:
        raise ValidationError(
            "reidentify gives this palace a new replica id and signing key (its ops so far "
            "stay under the old id, new ones go under the new one, and peers see a new "
            "origin): stop `logsync serve` on it and pass --yes to do it"
        )
    palace = palace_of(ctx)
    if not has_palace(palace):
        raise NotFoundError(f"no palace at {palace}: there is no identity to replace "
                            f"(`logsync init {palace}` makes a palace with a new one)")
    with open_store(ctx, must_exist=True, keyless=True) as store:  # a lost key is replaced
        done = store.reidentify()
    with open_store(ctx, must_exist=True) as store:  # records the new key, as every open
        now = store.replica_id
    payload: dict[str, Any] = {"palace": str(palace),
                               "previous_replica_id": done.previous_id, "replica_id": now,
                               "warning": done.warning}
    if as_json:
        emit_json(payload)
        return
    click.echo(f"replica id {done.previous_id} -> {now}: the ops held so far stay under "
               f"{done.previous_id}; new ones go under {now}")
    click.echo("restart `logsync serve` on this palace, if it runs, so it serves the new id")
    if done.warning:
        click.echo(f"Warning: {done.warning}", err=True)
