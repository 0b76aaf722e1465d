"""`logsync status`: is this replica in sync with each peer, both ways, and if not how far
behind and why. It looks now (`peercheck`): the state a daemon or `sync` saved is the
history (last success, last error, a catch-up under way), never the verdict."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import anyio
import click

from logsync import peers as peers_mod
from logsync.cli._common import (
    FiniteRange,
    checked_ca_file,
    emit_json,
    handles_errors,
    json_option,
    open_store,
    palace_of,
)
from logsync.cli.group import cli
from logsync.peercheck import KIND_WORDS, PROBE_TIMEOUT_S, probe_all
from logsync.peerstate import PeerBook
from logsync.store.signing_state import phrase, read_signing_states
from logsync.wire import skipped_sentence

EXIT_IN_SYNC, EXIT_FAILED, EXIT_BEHIND = 0, 1, 3


@cli.command("status", epilog="""\b
Examples:
  logsync status                 # ask every peer now, both ways
  logsync status --json          # the same, one JSON object (peers[].we_lack/they_lack)
  logsync status --cached        # only what the daemon saw at its last round

Exit status: 0 every peer reachable and in sync both ways; 3 reachable but something is
behind either way, a chain differs, or its vector lists origins this replica cannot pull
(or, with --cached, not known); 1 a peer failed
(unreachable, auth failed, protocol error).""")
@click.option("--cached", is_flag=True,
              help="Do not ask the peers; show what the daemon (or the last sync) saved.")
@click.option("--timeout", "deadline_s", type=FiniteRange(0.1, 60), show_default=True,
              default=PROBE_TIMEOUT_S, help="Seconds to wait for each peer (all at once).")
@click.option("--ca-file", type=click.Path(exists=True, dir_okay=False),
              callback=checked_ca_file,
              help="CA bundle for verifying https peers.")
@json_option
@click.pass_context
@handles_errors
def status_cmd(ctx: click.Context, as_json: bool, cached: bool, deadline_s: float,
               ca_file: str | None) -> None:
    """This replica (its origins, signed, pinned or unsigned, as `info`) and each peer,
    both ways: `we_lack` (ops the peer holds that we do not) and `they_lack` (ops we hold
    that it does not), whether it answers, its last success and error, and a catch-up
    under way."""
    palace = palace_of(ctx)
    book = PeerBook.load(palace)
    configured = peers_mod.load_peers(palace)
    with open_store(ctx, read_only=True) as store:
        local = store.version_vector()
        payload: dict[str, Any] = {"replica_id": store.replica_id, "palace": str(palace),
                                   "version_vector": local, **store.counts(unreviewed=True),
                                   "signing": {o: s.to_json() for o, s in
                                               read_signing_states(store).items()}}
        entries = [_redacted(book.get(p.key, p.url).as_upstream_peer_entry(local))
                   for p in configured]
        probes = anyio.run(lambda: probe_all(
            configured, local, deadline_s=deadline_s, ca_file=ca_file,
            digest_at=lambda o, seq: store.chain_digests_at(o, [seq])[0],
        )) if not cached and configured else None
    payload["checked"] = "cached" if cached else "now"
    if probes is not None:
        for entry, probe in zip(entries, probes, strict=True):
            entry.update(probe.as_dict())
    else:
        for entry in entries:
            entry["state"] = _cached_state(entry)
    payload["peers"] = entries
    code = _exit_code(entries)
    payload["in_sync"] = code == EXIT_IN_SYNC
    if as_json:
        emit_json(payload)
    else:
        _print(payload, palace)
    sys.exit(code)


def _cached_state(entry: dict[str, Any]) -> str:
    if entry["reachable"] is None:
        return "never contacted"
    if entry["reachable"]:
        return "reachable"
    return KIND_WORDS.get(entry.get("last_error_kind") or "", "unreachable")


def _exit_code(entries: list[dict[str, Any]]) -> int:
    if any(e["state"] != "reachable" for e in entries):
        return EXIT_FAILED
    if any(e.get("we_lack") != 0 or e.get("they_lack") != 0 or e.get("diverged")
           or e.get("skipped_origins") for e in entries):
        return EXIT_BEHIND  # None (not known, with --cached) counts as behind
    return EXIT_IN_SYNC


def _redacted(entry: dict[str, Any]) -> dict[str, Any]:
    """A peer entry safe to print: no credentials in its URL (or in a URL-shaped name)."""
    out = dict(entry)
    for key in ("url", "name"):
        if isinstance(out.get(key), str) and (key == "url" or "://" in out[key]):
            out[key] = peers_mod.redact_url(out[key])
    return out


def _print(payload: dict[str, Any], palace: Path) -> None:
    click.echo(f"replica {payload['replica_id']}  ({palace})")
    unreviewed = payload.get("conflicts_unreviewed", payload["conflicts"])
    click.echo(f"events {payload['events']}  artifacts {payload['artifacts']}  "
               f"conflicts {payload['conflicts']} ({unreviewed} not reviewed)  "
               f"quarantined {payload['quarantined']}")
    for origin, top in sorted(payload["version_vector"].items()):
        signing = payload["signing"].get(origin)  # None: an op that came between two reads
        click.echo(f"  holds {origin} up to {top}" + (f" ({phrase(signing)})" if signing else ""))
    if not payload["peers"]:
        click.echo("no peers configured (logsync peers add NAME URL)")
    for entry in payload["peers"]:
        _print_peer(entry, payload["checked"])
    if unreviewed:
        click.echo(f"{unreviewed} conflicts not reviewed: see `logsync conflicts`", err=True)


def _print_peer(entry: dict[str, Any], checked: str) -> None:
    when = "now" if checked == "now" else "at its last round"
    click.echo(f"peer {entry['name']} {entry['url']}: {entry['state']} ({when}), last "
               f"success {entry['last_success_at'] or 'never'}")
    if entry.get("error") and checked == "now":
        click.echo(f"    error: {entry['error']}")
    elif entry["last_error"]:
        click.echo(f"    last error ({entry['last_error_at']}): {entry['last_error']}")
    we, they = entry.get("we_lack"), entry.get("they_lack")
    for origin in entry.get("diverged") or []:
        click.echo(f"    DIVERGED: its ops of {origin} differ from ours (the next sync records "
                   "where: see `logsync conflicts`)")
    for origin, reason in sorted((entry.get("stopped_origins") or {}).items()):
        click.echo(f"    STOPPED at its last round: origin {origin}: {reason} (it will not "
                   "catch up by itself: see `logsync quarantine` and `logsync conflicts`)")
    skipped = skipped_sentence(entry.get("skipped_origins") or {})
    if skipped:
        click.echo(f"    NOT IN SYNC: {skipped}")
    if we is None and they is None:
        click.echo("    in sync: not known (no vector from it)")
    elif we == 0 and they == 0 and not entry.get("diverged") and not skipped:
        click.echo("    in sync both ways")
    else:
        # counted in origin_seq: an upstream hub's own origin may skip numbers (it counts
        # by rowid), so for such an origin this is an upper bound
        click.echo(f"    we lack up to {_count(we)} of its ops; it lacks up to {_count(they)} "
                   "of ours")
        for origin, n in sorted((entry.get("we_lack_by_origin") or entry["drift"]).items()):
            click.echo(f"      we lack up to {n} of {origin}")
        for origin, n in sorted((entry.get("they_lack_by_origin") or {}).items()):
            click.echo(f"      it lacks up to {n} of {origin}")
    catchup = entry.get("catchup")
    if catchup:
        eta = f", about {catchup['eta_s']:.0f} s left" if catchup.get("eta_s") else ""
        click.echo(f"    catching up: {catchup['done']}/{catchup['total']} ops "
                   f"({catchup['rate']:.0f} ops/s{eta})")
    if they and entry.get("takes_pushes") is False:
        click.echo("    it takes no pushes: it must pull from this replica (or run "
                   "`logsync sync` on it)")


def _count(value: int | None) -> str:
    return "?" if value is None else str(value)
