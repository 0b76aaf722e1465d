"""Replication commands: serve, sync, status, peers, conflicts, quarantine."""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import click

from logsync import peers as peers_mod
from logsync.cli._common import emit_json, handles_errors, json_option, open_store, palace_of
from logsync.cli.group import cli
from logsync.defaults import DEFAULT_HOST, DEFAULT_INTERVAL_S, DEFAULT_PORT
from logsync.engine import RoundReport, error_kind
from logsync.errors import ConfigError
from logsync.peerstate import PeerBook
from logsync.store import Store
from logsync.store.signing_state import phrase, read_signing_states


@cli.command("serve")
@click.option("--palace", "serve_palace", type=click.Path(file_okay=False),
              help="Palace directory (as upstream's `serve --palace`; overrides the global one).")
@click.option("--host", default=DEFAULT_HOST, show_default=True)
@click.option("--port", type=int, default=DEFAULT_PORT, show_default=True)
@click.option("--token", envvar="LOGSYNC_TOKEN", help="Bearer token (env LOGSYNC_TOKEN); "
              "required for a non-loopback bind.")
@click.option("--interval", type=float, default=DEFAULT_INTERVAL_S, show_default=True,
              help="Anti-entropy interval in seconds (jittered).")
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False))
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False))
@click.option("--ca-file", type=click.Path(exists=True, dir_okay=False),
              help="CA bundle for verifying https peers.")
@click.option("--no-notify", is_flag=True, help="Do not follow peers' /logstream/stream.")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]),
              default="info", show_default=True)
@json_option
@click.pass_context
@handles_errors
def serve_cmd(ctx: click.Context, as_json: bool, serve_palace: str | None, host: str,
              port: int, token: str | None,
              interval: float, tls_cert: str | None, tls_key: str | None, ca_file: str | None,
              no_notify: bool, log_level: str) -> None:
    """Serve this palace over /sync/* and pull from every peer in peers.json."""
    from logsync.daemon import DaemonConfig, serve  # the server stack loads only here

    logging.basicConfig(level=log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "httpcore"):  # one line per request drowns the daemon's own log
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))
    config = DaemonConfig(
        palace=Path(serve_palace).expanduser() if serve_palace else palace_of(ctx),
        host=host, port=port, token=peers_mod.check_token(token, "--token (or LOGSYNC_TOKEN)"),
        interval=interval, tls_cert=tls_cert, tls_key=tls_key, ca_file=ca_file,
        notifications=not no_notify, log_level=log_level,
    )
    config.check()

    def banner(url: str) -> None:  # only once the port is ours and the TLS pair loads
        click.echo(f"logsync serving {config.palace} on {url} (Ctrl-C to stop)", err=True)

    serve(config, announce=banner)


@cli.command("sync")
@click.option("--peer", "peer_url", help="Pull from this URL instead of every configured peer.")
@click.option("--token", envvar="LOGSYNC_PEER_TOKEN", help="Bearer token for --peer.")
@click.option("--ca-file", type=click.Path(exists=True, dir_okay=False))
@click.option("--timeout", type=float, default=30.0, show_default=True,
              help="Per-request timeout in seconds.")
@json_option
@click.pass_context
@handles_errors
def sync_cmd(ctx: click.Context, as_json: bool, peer_url: str | None, token: str | None,
             ca_file: str | None, timeout: float) -> None:
    """One pull round against one peer or every configured peer; exit 1 if any failed."""
    palace = palace_of(ctx)
    if peer_url:
        targets = [peers_mod.Peer(url=peers_mod.check_url(peer_url),
                                  token=peers_mod.check_token(token, "--token"))]
    else:
        targets = peers_mod.load_peers(palace)
        if not targets:
            raise ConfigError(f"no peers configured ({peers_mod.peers_path(palace)}) "
                              "and no --peer given")
    show_progress = not as_json and sys.stdout.isatty()
    with open_store(ctx) as store:
        results = [_sync_one(store, p, ca_file, timeout, show_progress) for p in targets]
        _record(palace, targets, results, peer_url is None)
    stats = [r["stats"] for r in results]
    if as_json:
        emit_json(stats)
    else:
        for result in results:
            _print_result(result)
    if any("error" in s or s.get("failed_origins") for s in stats):
        sys.exit(1)


def _sync_one(store: Store, peer: peers_mod.Peer, ca_file: str | None, timeout: float,
              show_progress: bool) -> dict[str, Any]:
    from logsync.client import PeerClient

    label = peer.name or peers_mod.redact_url(peer.url)
    report = RoundReport(peer=label)

    async def run() -> RoundReport | Exception:
        # The outcome is returned, not raised, so the task group cannot wrap it.
        outcome: RoundReport | Exception
        async with PeerClient(peer.url, peer.token, name=label, ca_file=ca_file,
                              timeout=timeout) as client, anyio.create_task_group() as tg:
            if show_progress:
                tg.start_soon(_progress, store, report)
            try:
                outcome = await client.run_round(store, report=report)
            except Exception as exc:  # noqa: BLE001 - one peer's fault stays with that peer
                outcome = exc
            tg.cancel_scope.cancel()
        return outcome

    try:
        done = anyio.run(run)
    except Exception as exc:  # noqa: BLE001 - e.g. a URL the client refuses (ConfigError)
        done = exc
    if isinstance(done, Exception):
        kind = error_kind(done)
        message = str(done) or type(done).__name__
        if kind == "internal":
            message = f"internal error {type(done).__name__}: {message}"
        stats = {"peer_name": label, "peer_url": peers_mod.redact_url(peer.url),
                 "error": _unnamed(label, message), "error_kind": kind}
        return {"peer": peer, "report": report, "stats": stats, "error": done}
    stats = {**done.as_upstream_stats(peers_mod.redact_url(peer.url)), "peer_name": label,
             "failed_origins": {o: _unnamed(label, r.removeprefix("failed: "))
                                for o, r in done.failed_origins().items()},
             "conflicts": done.conflicts, "quarantined": done.quarantined,
             "per_origin_detail": {o: p.as_dict() for o, p in done.origins.items()}}
    return {"peer": peer, "report": done, "stats": stats, "error": None}


async def _progress(store: Store, report: RoundReport) -> None:
    """A bar over the ops the peer's vector says we lack, fed by the live report."""
    while not report.remote_vector:  # noqa: ASYNC110 - the report is plain data, polled
        await anyio.sleep(0.05)
    local = await anyio.to_thread.run_sync(store.version_vector)
    total = sum(max(0, top - local.get(o, 0)) for o, top in report.remote_vector.items()
                if o != store.replica_id)
    with click.progressbar(length=max(total, 1), label=f"pulling from {report.peer}",
                           file=sys.stderr) as bar:
        shown = 0
        while True:
            now = report.applied + report.total("duplicates")
            bar.update(max(0, min(now, total) - shown))
            shown = max(shown, min(now, total))
            await anyio.sleep(0.1)


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
        else:
            state.record_success(result["report"], now)
    book.save(palace)


def _unnamed(peer: str, message: str) -> str:
    """The message without a leading `peer NAME: `: output names the peer once."""
    return message.removeprefix(f"peer {peer}: ")


def _print_result(result: dict[str, Any]) -> None:
    stats = result["stats"]
    name = stats.get("peer_name") or stats.get("peer_url")
    if "error" in stats:
        click.echo(f"  {name}: ERROR ({stats['error_kind']}) {stats['error']}", err=True)
        return
    click.echo(f"  {name} ({stats['peer_replica']}): +{stats['pulled_events']} events, "
               f"+{stats['pulled_artifacts']} artifacts, {stats['conflicts']} conflicts, "
               f"{stats['quarantined']} quarantined")
    for origin, detail in sorted(stats["per_origin_detail"].items()):
        if detail.get("applied") or detail.get("artifacts"):
            click.echo(f"    {origin}: +{detail.get('applied', 0)} events, "
                       f"+{detail.get('artifacts', 0)} artifacts")
    for origin, reason in sorted(stats["failed_origins"].items()):
        click.echo(f"  {name}: origin {origin} FAILED: {reason}", err=True)


@cli.command("status")
@json_option
@click.pass_context
@handles_errors
def status_cmd(ctx: click.Context, as_json: bool) -> None:
    """This replica, whether each origin it holds is signed, pinned or unsigned (as
    `info`), and how far behind each peer it is."""
    palace = palace_of(ctx)
    with open_store(ctx, read_only=True) as store:
        local = store.version_vector()
        payload: dict[str, Any] = {"replica_id": store.replica_id, "palace": str(palace),
                                   "version_vector": local, **store.counts(),
                                   "signing": {o: s.to_json() for o, s in
                                               read_signing_states(store).items()}}
    book = PeerBook.load(palace)
    configured = peers_mod.load_peers(palace)
    payload["peers"] = [
        _redacted(book.get(p.key, p.url).as_upstream_peer_entry(local)) for p in configured
    ]
    if as_json:
        emit_json(payload)
        return
    click.echo(f"replica {payload['replica_id']}  ({palace})")
    click.echo(f"events {payload['events']}  artifacts {payload['artifacts']}  "
               f"conflicts {payload['conflicts']}  quarantined {payload['quarantined']}")
    for origin, top in sorted(local.items()):
        signing = payload["signing"].get(origin)  # None: an op that came between two reads
        click.echo(f"  holds {origin} up to {top}" + (f" ({phrase(signing)})" if signing else ""))
    if not payload["peers"]:
        click.echo("no peers configured (logsync peers add NAME URL)")
    for entry in payload["peers"]:
        _print_peer(entry)


def _redacted(entry: dict[str, Any]) -> dict[str, Any]:
    """A peer entry safe to print: no credentials in its URL (or in a URL-shaped name)."""
    out = dict(entry)
    for key in ("url", "name"):
        if isinstance(out.get(key), str) and (key == "url" or "://" in out[key]):
            out[key] = peers_mod.redact_url(out[key])
    return out


def _print_peer(entry: dict[str, Any]) -> None:
    reach = {True: "reachable", False: "UNREACHABLE", None: "never contacted"}[entry["reachable"]]
    click.echo(f"peer {entry['name']} {entry['url']}: {reach}, last sync "
               f"{entry['last_success_at'] or 'never'}")
    if entry["last_error"]:
        click.echo(f"    last error ({entry['last_error_at']}): {entry['last_error']}")
    behind = {o: n for o, n in entry["drift"].items() if n}
    if not behind and entry["remote_version_vector"] is not None:
        click.echo("    in sync with what it had at the last round")
    for origin, n in sorted(behind.items()):
        click.echo(f"    {n} ops behind {origin}")
