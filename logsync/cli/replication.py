"""Replication commands: serve, sync, status, peers, conflicts, quarantine."""

from __future__ import annotations

import logging
import sys
import time
from functools import partial
from typing import Any

import anyio
import click

from logsync import peers as peers_mod
from logsync import progress
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
from logsync.defaults import (
    DEFAULT_CACHE_MIB,
    DEFAULT_COALESCE_S,
    DEFAULT_HOST,
    DEFAULT_INTERVAL_S,
    DEFAULT_PORT,
    MIN_INTERVAL_S,
)
from logsync.engine import RoundReport, error_kind
from logsync.errors import ConfigError
from logsync.peerstate import PeerBook
from logsync.report import STOP_STORE
from logsync.store import Store
from logsync.store.apply import CONFLICT_STOPS

# The whole reason of a stop that recorded a conflict; any other stop quarantined its op
# (a quarantine reason quotes the op, so it may end like these: only equality tells).
CONFLICT_REASONS = frozenset(f"{STOP_STORE}: {stop}" for stop in CONFLICT_STOPS)


@cli.command("serve", epilog="""\b
Examples:
  logsync serve                                    # loopback, the default palace
  logsync --palace ~/palace serve --host 0.0.0.0 --token "$T" --tls-cert c.pem --tls-key k.pem

Stop it with Ctrl-C or SIGTERM: pulls stop, open event streams end, the state is saved.""")
@click.option("--palace", "serve_palace", type=click.Path(file_okay=False),
              help="Palace directory (as upstream's `serve --palace`; overrides the global one).")
@click.option("--host", default=DEFAULT_HOST, show_default=True,
              help="Address to bind; anything but loopback needs --token.")
@click.option("--port", type=int, default=DEFAULT_PORT, show_default=True,
              help="Port to bind (0: any free port, printed at start).")
@click.option("--token", envvar="LOGSYNC_TOKEN", help="Bearer token (env LOGSYNC_TOKEN); "
              "required for a non-loopback bind.")
@click.option("--interval", type=FiniteRange(MIN_INTERVAL_S),
              default=DEFAULT_INTERVAL_S, show_default=True,
              help="Anti-entropy interval in seconds (jittered).")
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False),
              help="Serve https with this certificate (PEM; with --tls-key).")
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False),
              help="The private key of --tls-cert (PEM).")
@click.option("--ca-file", type=click.Path(exists=True, dir_okay=False),
              callback=checked_ca_file,
              help="CA bundle for verifying https peers.")
@click.option("--no-notify", is_flag=True, help="Do not follow peers' /logstream/stream.")
@click.option("--commit-check-ms", type=FiniteRange(0, 1000), default=5.0,
              show_default=True, help="Look for commits by other processes (the CLI, an agent's "
              "store) at most this often, so their events go out at once (on Linux only "
              "when the store's files are written; elsewhere every N ms); 0: only the "
              "event streams' 100 ms poll.")
@click.option("--coalesce-ms", type=FiniteRange(0, 1000), default=DEFAULT_COALESCE_S * 1000,
              show_default=True, help="A change stream sends a subscriber at most one batch "
              "of frames per this window (the first change after a quiet spell at once); "
              "0: every change at once.")
@click.option("--no-snapshot", is_flag=True, help="An empty store pulls op by op instead of "
              "joining from a peer's snapshot.")
@click.option("--cache-mb", type=int, default=DEFAULT_CACHE_MIB, show_default=True,
              help="Memory for /sync/ops answers kept to serve again (encoded ops and "
              "whole pages, half each), in MiB; 0 keeps none.")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]),
              default="info", show_default=True, help="How much the daemon logs (stderr).")
@json_option
@click.pass_context
@handles_errors
def serve_cmd(ctx: click.Context, as_json: bool, serve_palace: str | None, host: str,
              port: int, token: str | None,
              interval: float, tls_cert: str | None, tls_key: str | None, ca_file: str | None,
              no_notify: bool, commit_check_ms: float, coalesce_ms: float,
              no_snapshot: bool, cache_mb: int, log_level: str) -> None:
    """Serve this palace over /sync/* and pull from every peer in peers.json."""
    from logsync.daemon import DaemonConfig, serve  # the server stack loads only here

    logging.basicConfig(level=log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "httpcore"):  # one line per request drowns the daemon's own log
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))
    config = DaemonConfig(
        palace=palace_of(ctx, serve_palace),
        host=host, port=port, token=peers_mod.check_token(token, "--token (or LOGSYNC_TOKEN)"),
        interval=interval, tls_cert=tls_cert, tls_key=tls_key, ca_file=ca_file,
        notifications=not no_notify, log_level=log_level, snapshot=not no_snapshot,
        commit_check=commit_check_ms / 1000, coalesce=coalesce_ms / 1000, cache_mib=cache_mb,
    )
    config.check()

    def banner(url: str) -> None:  # only once the port is ours and the TLS pair loads
        click.echo(f"logsync serving {config.palace} on {url} (Ctrl-C to stop)", err=True)

    serve(config, announce=banner)


@cli.command("sync", epilog="""\b
Examples:
  logsync sync                                  # every peer in peers.json, both ways
  logsync sync --peer https://desk:8742 --token T   # one peer, both ways
  logsync sync --peer http://hub:8742 --pull-only  # a MemPalace hub: pull only

Exit status: 0 every peer done both ways, 1 a peer or an origin failed, or an origin was
stopped (by an op held in quarantine, or a fork or id collision recorded as a conflict).""")
@click.option("--peer", "peer_url", help="Sync with this URL instead of every configured peer.")
@click.option("--token", envvar="LOGSYNC_PEER_TOKEN", help="Bearer token for --peer "
              "(env LOGSYNC_PEER_TOKEN).")
@click.option("--ca-file", type=click.Path(exists=True, dir_okay=False),
              callback=checked_ca_file,
              help="CA bundle for verifying an https peer.")
@click.option("--timeout", type=FiniteRange(0.1, 3600), default=30.0, show_default=True,
              help="How long one connect or read may wait, in seconds (a whole request "
              "has its own deadline: 60 s; a snapshot download must move 1 MiB a second after "
              "its first 60 s).")
@click.option("--pull-only", is_flag=True, help="Only pull what the peer holds and we lack.")
@click.option("--push-only", is_flag=True, help="Only push what we hold and the peer lacks.")
@click.option("--no-snapshot", is_flag=True, help="An empty store pulls op by op instead of "
              "joining from a peer's snapshot.")
@json_option
@click.pass_context
@handles_errors
def sync_cmd(ctx: click.Context, as_json: bool, peer_url: str | None, token: str | None,
             ca_file: str | None, timeout: float, pull_only: bool, push_only: bool,
             no_snapshot: bool) -> None:
    """Reconcile with one peer or every configured peer: pull what they hold that we
    lack, then push what we hold that they lack (to a peer that takes pushes: a logsync
    daemon with a token; a MemPalace hub must pull from us instead)."""
    if pull_only and push_only:
        raise ConfigError("--pull-only and --push-only exclude each other: pass one or neither")
    palace = palace_of(ctx)
    if peer_url:
        targets = [peers_mod.Peer(url=peers_mod.check_url(peer_url),
                                  token=peers_mod.check_token(token, "--token"))]
    else:
        targets = peers_mod.load_peers(palace)
        if not targets:
            raise ConfigError(f"no peers configured ({peers_mod.peers_path(palace)}) "
                              "and no --peer given")
    terminal = not as_json and sys.stderr.isatty()
    joined = None
    if not (no_snapshot or push_only):
        from logsync.snapshot.joining import join_if_empty

        joined = join_if_empty(palace, targets, ca_file=ca_file, timeout=timeout,
                               say=lambda line: click.echo(f"  {line}", err=True))
        if joined is not None and not as_json:
            click.echo(f"  {joined.line()}")
    # a joined snapshot passed the integrity check a moment ago: no second quick check
    with open_store(ctx, check=joined is None) as store:
        results = [_sync_one(store, p, ca_file, timeout, terminal, pull=not push_only,
                             push=not pull_only) for p in targets]
        _record(palace, targets, results, peer_url is None)
    stats = [r["stats"] for r in results]
    for entry in stats:
        if joined is not None and entry.get("peer_name") == joined.peer:
            entry["snapshot"] = joined.as_dict()  # what arrived counts as pulled
            entry["pulled_events"] = entry.get("pulled_events", 0) + joined.events
            entry["pulled_artifacts"] = entry.get("pulled_artifacts", 0) + joined.artifacts
    if as_json:
        emit_json(stats)
    else:
        for result in results:
            _print_result(result)
    if any(_failed(s) for s in stats):
        sys.exit(1)


def _failed(stats: dict[str, Any]) -> bool:
    push = stats.get("push") or {}
    return bool("error" in stats or stats.get("failed_origins") or stats.get("stopped_origins")
                or "error" in push
                or any(r.startswith("failed") for r in push.get("stopped", {}).values()))


def _sync_one(store: Store, peer: peers_mod.Peer, ca_file: str | None, timeout: float,
              terminal: bool, *, pull: bool = True, push: bool = True) -> dict[str, Any]:
    """Pull, then push, against one peer; each outcome kept, nothing raised."""
    from logsync.client import PeerClient
    from logsync.push import PushReport

    label = peer.name or peers_mod.redact_url(peer.url)
    report, pushed = RoundReport(peer=label), PushReport(peer=label)

    async def watched(verb: str, live: Any, work: Any) -> Any:
        async with anyio.create_task_group() as tg:
            tg.start_soon(partial(progress.watch, live, verb, label, terminal=terminal))
            try:
                return await work
            except Exception as exc:  # noqa: BLE001 - one peer's fault stays with that peer
                return exc
            finally:
                tg.cancel_scope.cancel()

    async def run() -> tuple[Any, Any]:
        async with PeerClient(peer.url, peer.token, name=label, ca_file=ca_file,
                              timeout=timeout) as client:
            pulled = await watched("pulling from", report, client.run_round(store,
                                   report=report)) if pull else None
            if not push or isinstance(pulled, Exception):  # the pull's error says it all
                return pulled, None
            return pulled, await watched("pushing to", pushed, client.run_push(
                store, report=pushed))

    try:
        done, push_done = anyio.run(run)
    except Exception as exc:  # noqa: BLE001 - e.g. a URL the client refuses (ConfigError)
        done, push_done = exc, None
    stats: dict[str, Any] = {"peer_name": label, "peer_url": peers_mod.redact_url(peer.url)}
    if isinstance(done, Exception):
        stats |= _error_stats(label, done)
    elif done is not None:
        stats |= {**done.as_upstream_stats(peers_mod.redact_url(peer.url)), "peer_name": label,
                  "failed_origins": {o: _unnamed(label, r.removeprefix("failed: "))
                                     for o, r in done.failed_origins().items()},
                  "stopped_origins": done.stopped_origins(),
                  "skipped_origins": dict(done.skipped_origins),
                  "conflicts": done.conflicts, "quarantined": done.quarantined,
                  "per_origin_detail": {o: p.as_dict() for o, p in done.origins.items()}}
    if push and not isinstance(done, Exception):
        stats["push"] = (_error_stats(label, push_done) if isinstance(push_done, Exception)
                         else pushed.as_dict() if push_done is not None else None)
    return {"peer": peer, "report": done if not isinstance(done, Exception) else report,
            "stats": stats, "error": done if isinstance(done, Exception) else None,
            "push": pushed if push_done is not None and not isinstance(push_done, Exception)
            else None}


def _error_stats(label: str, error: BaseException) -> dict[str, Any]:
    kind = error_kind(error)
    message = str(error) or type(error).__name__
    if kind == "internal":
        message = f"internal error {type(error).__name__}: {message}"
    return {"error": _unnamed(label, message), "error_kind": kind}


def _record(palace: Any, targets: list[peers_mod.Peer], results: list[dict[str, Any]],
            configured: bool) -> None:
    """Remember outcomes for `logsync status`, for configured peers only."""
    if not configured:
        return
    book = PeerBook.load(palace)
    now = time.time()
    for result in results:
        peer = result["peer"]
        state = book.get(peer.key, peer.url)
        state.record_attempt(now)
        if result["error"] is not None:
            state.record_failure(result["error"], now, result["report"])
        elif result["report"] is not None:
            state.record_success(result["report"], now)
        if result["push"] is not None:
            state.record_push(result["push"], now)
    book.save(palace)


def _unnamed(peer: str, message: str) -> str:
    """The message without a leading `peer NAME: `: output names the peer once."""
    return message.removeprefix(f"peer {peer}: ")


def _print_result(result: dict[str, Any]) -> None:
    stats = result["stats"]
    name = stats.get("peer_name") or stats.get("peer_url")
    if "error" in stats:
        click.echo(f"  {name}: ERROR ({stats['error_kind']}) {stats['error']}", err=True)
    elif "pulled_events" in stats:
        click.echo(f"  {name} ({stats['peer_replica']}): +{stats['pulled_events']} events, "
                   f"+{stats['pulled_artifacts']} artifacts, {stats['conflicts']} conflicts, "
                   f"{stats['quarantined']} quarantined")
        for origin, detail in sorted(stats["per_origin_detail"].items()):
            if detail.get("applied") or detail.get("artifacts"):
                click.echo(f"    {origin}: +{detail.get('applied', 0)} events, "
                           f"+{detail.get('artifacts', 0)} artifacts")
        for origin, reason in sorted(stats["failed_origins"].items()):
            click.echo(f"  {name}: origin {origin} FAILED: {reason}", err=True)
        for origin, reason in sorted(stats.get("stopped_origins", {}).items()):
            held = ("recorded as a conflict: logsync conflicts" if reason in CONFLICT_REASONS
                    else "held in quarantine: logsync quarantine")
            click.echo(f"  {name}: origin {origin} STOPPED: {reason} ({held})", err=True)
        if result["report"] is not None and result["report"].skipped_line():
            click.echo(f"  {name}: {result['report'].skipped_line()}", err=True)
    _print_push(name, stats.get("push"))


def _print_push(name: str, push: dict[str, Any] | None) -> None:
    if push is None:
        return
    if "error" in push:
        click.echo(f"  {name}: push ERROR ({push['error_kind']}) {push['error']}", err=True)
    elif push["supported"] is False:
        click.echo(f"  {name}: takes no pushes (no 'push' extension: a MemPalace hub, or a "
                   "logsync daemon without a token); it must pull from this replica", err=True)
    else:
        click.echo(f"  {name}: pushed +{push['pushed_events']} events; it lacks "
                   f"{push['they_lack']} of ours")
        for origin, reason in sorted(push["stopped"].items()):
            click.echo(f"  {name}: push of origin {origin} stopped: {reason}", err=True)
