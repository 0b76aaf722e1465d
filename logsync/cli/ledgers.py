"""Ledger and peer-list commands: peers (add, remove, list), and the listings of the
conflicts and quarantine ledgers (groups: their subcommands, which change a ledger, are
in `cli/operator.py`)."""

from __future__ import annotations

from typing import Any

import click

from logsync import peers as peers_mod
from logsync.cli._common import (
    emit_json,
    handles_errors,
    json_option,
    open_store,
    palace_of,
    row_limit,
)
from logsync.cli.group import cli
from logsync.errors import shorten
from logsync.store.ledgers import CONFLICT_KINDS, check_kind, check_origin


@cli.group("peers")
def peers_group() -> None:
    """Manage peers.json (the upstream format).

    Example:

    \b
      logsync peers add b http://127.0.0.1:8802 --token secret-b
    """


@peers_group.command("add")
@click.argument("name")
@click.argument("url")
@click.option("--token", help="Bearer token for this peer.")
@click.option("--push", is_flag=True, help="Push to this peer whenever our log changes (for a "
              "peer that cannot reach us, e.g. we are behind NAT); it must take pushes.")
@json_option
@click.pass_context
@handles_errors
def peers_add(ctx: click.Context, as_json: bool, name: str, url: str, token: str | None,
              push: bool) -> None:
    """Add (or replace) peer NAME at URL.

    Example:

    \b
      logsync peers add hub http://hub.example:8080 --token secret
      logsync peers add desk https://desk.lan:8742 --token T --push
    """
    peer = peers_mod.add_peer(palace_of(ctx), name, url, token, push=push)
    _print_peers([peer], as_json, "Added")


@peers_group.command("remove")
@click.argument("name")
@json_option
@click.pass_context
@handles_errors
def peers_remove(ctx: click.Context, as_json: bool, name: str) -> None:
    """Remove the peer called NAME (or with that URL).

    Example:

    \b
      logsync peers remove hub
    """
    peer = peers_mod.remove_peer(palace_of(ctx), name)
    _print_peers([peer], as_json, "Removed")


@peers_group.command("list")
@json_option
@click.pass_context
@handles_errors
def peers_list(ctx: click.Context, as_json: bool) -> None:
    """The configured peers (tokens are never shown).

    Example:

    \b
      logsync peers list --json
    """
    _print_peers(peers_mod.load_peers(palace_of(ctx)), as_json, None)


def _print_peers(peers: list[peers_mod.Peer], as_json: bool, verb: str | None) -> None:
    public = [{"name": p.name, "url": peers_mod.redact_url(p.url), "token_set": bool(p.token),
               "push": p.push} for p in peers]
    if as_json:
        emit_json({"peers": public} if verb is None else public[0])
        return
    for entry in public:
        prefix = f"{verb} " if verb else ""
        auth = " (token set)" if entry["token_set"] else ""
        push = " (push)" if entry["push"] else ""
        click.echo(f"{prefix}{entry['name'] or '-'}  {entry['url']}{auth}{push}")
    if verb is None and not public:
        click.echo("no peers configured")


LIMIT_HELP = "Show at most this many rows, newest first (at most 500)."
ORIGIN_HELP = "Only rows of this origin (a replica id)."


@cli.group("conflicts", invoke_without_command=True)
@click.option("--limit", type=int, default=100, show_default=True, help=LIMIT_HELP)
@click.option("--origin", default=None, help=ORIGIN_HELP)
@click.option("--kind", default=None,
              help=f"Only conflicts of this kind: {', '.join(CONFLICT_KINDS)}.")
@click.option("--unreviewed", is_flag=True,
              help="Only conflicts `logsync conflicts review` has not marked.")
@json_option
@click.pass_context
@handles_errors
def conflicts_cmd(ctx: click.Context, as_json: bool, limit: int, origin: str | None,
                  kind: str | None, unreviewed: bool) -> None:
    """Divergence found while applying remote ops (never overwritten, never silent). A
    chain divergence shows its first divergent seq, the peer, both chain digests and
    both ops; a key change both keys (short: --json has them whole). Each row starts
    with its id, which `logsync conflicts review` takes.

    Example:

    \b
      logsync conflicts --kind fork --unreviewed
    """
    if ctx.invoked_subcommand is not None:
        return
    origin, kind = checked_filters(origin, kind)
    row_limit(limit)
    with open_store(ctx, read_only=True) as store:
        rows = store.list_conflicts(limit, origin=origin, kind=kind, unreviewed=unreviewed)
    _print_ledger(rows, as_json, "conflicts", "detected_at")


@cli.group("quarantine", invoke_without_command=True)
@click.option("--limit", type=int, default=100, show_default=True, help=LIMIT_HELP)
@click.option("--origin", default=None, help=ORIGIN_HELP)
@json_option
@click.pass_context
@handles_errors
def quarantine_cmd(ctx: click.Context, as_json: bool, limit: int, origin: str | None) -> None:
    """Remote ops refused by validation, kept verbatim with the reason (`logsync
    quarantine retry` applies those whose cause is gone).

    Example:

    \b
      logsync quarantine --origin rep_0123456789abcdef0123456789abcdef --json
    """
    if ctx.invoked_subcommand is not None:
        return
    origin, _ = checked_filters(origin, None)
    row_limit(limit)
    with open_store(ctx, read_only=True) as store:
        rows = store.list_quarantine(limit, origin=origin)
    _print_ledger(rows, as_json, "quarantined", "received_at")


def checked_filters(origin: str | None, kind: str | None) -> tuple[str | None, str | None]:
    """--origin and --kind checked, each failure one sentence naming the option."""
    return (None if origin is None else check_origin(origin, "--origin"),
            None if kind is None else check_kind(kind, "--kind"))


def _print_ledger(rows: list[dict[str, Any]], as_json: bool, noun: str, when: str) -> None:
    if as_json:
        emit_json({noun: rows, "count": len(rows)})
        return
    if not rows:
        click.echo("no conflicts" if noun == "conflicts" else f"no {noun} ops")
    for row in rows:
        seq = "" if row["origin_seq"] is None else f"#{row['origin_seq']}"
        mark = " (reviewed)" if row.get("reviewed_at") else ""
        click.echo(f"[{row['id']}] {row[when]}  {row['kind']}  {row['origin_replica']}{seq}  "
                   f"{row['item_id']}  x{row['times_seen']}{mark}: {row['reason']}")
        for line in _chain_detail(row):
            click.echo(f"    {line}")


SHORT_HEX = 12  # digits of a digest or key shown; the JSON keeps them whole
SHORT_BODY = 40


def _chain_detail(row: dict[str, Any]) -> list[str]:
    """Lines under a chain conflict (the JSON holds all of it): for a `divergence`, the
    first divergent seq, the peer, and each side's chain digest and op there; for a
    `key_change`, the pinned key and the peer's. Any other row: none. A ledger another
    program wrote may hold anything: what is not the expected shape shows as '?'."""
    local, remote = _mapping(row.get("local")), _mapping(row.get("remote"))
    peer = _text(remote.get("peer"))
    if row.get("kind") == "divergence":
        return [f"first divergent seq {row['origin_seq']}, peer {peer}",
                f"here:  digest {_short_hex(local.get('digest'))}  "
                f"{_op_phrase(local.get('op'), 'no op held here')}",
                f"peer:  digest {_short_hex(remote.get('digest'))}  "
                f"{_op_phrase(remote.get('op'), 'no op sent')}"]
    if row.get("kind") == "key_change":
        return [f"peer {peer}: pinned key {_short_hex(local.get('public_key'))}, "
                f"the peer's {_short_hex(remote.get('public_key'))}"]
    return []


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _text(value: Any) -> str:
    return value if isinstance(value, str) and value.isprintable() else "?"


def _short_hex(value: Any) -> str:
    if not isinstance(value, str) or not value:
        return "none" if value is None else "?"
    short = value[:SHORT_HEX]
    return "?" if not all(c in "0123456789abcdef" for c in short) else (
        short + ("..." if len(value) > SHORT_HEX else ""))


def _op_phrase(op: Any, absent: str) -> str:
    """An op's id and its body, cut and quoted (control characters escaped)."""
    if op is None:
        return absent
    if not isinstance(op, dict):
        return "op ?"
    body = op.get("body")
    return f"op {_text(op.get('id'))} body {shorten(body, SHORT_BODY)}"

