"""`logsync serve`: the HTTP server and one pull loop per peer, in one task group.

Every background task has an owner (STYLE.md §7): the daemon's task group
holds the uvicorn server, the peers.json watcher and one scope per peer; each
peer scope holds its pull loop and its change-notification watcher. SIGINT or
SIGTERM cancels the pull loops first -- a page being applied runs to its
commit in its worker thread, because the store call is not abandoned on
cancel -- then stops the server. Decisions about *when* to pull live in
`logsync.peerloop.PeerLoop` (one per peer); this module keeps time, does the I/O
and carries out the loop's plans.

A fault stays with its cause (invariant 9): whatever a round raises -- a peer's
error, a bug of ours, a local store fault -- is logged in one line (the traceback
at DEBUG), recorded in that peer's state with its kind (`engine.error_kind`), and
backs off only that peer's loop. A store fault (disk full, read-only, corrupt)
also pauses every pull and answers `/sync/*` with a 503 naming it, until a
periodic `Store.health_problem()` check passes. Every round has a deadline (the
client's); claims on origins are the peer loop's (`peerloop.Claims`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import random
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import uvicorn
from anyio.abc import TaskGroup

from logsync import peers as peers_mod
from logsync import progress
from logsync.client import PeerClient, tls_context
from logsync.daemonconfig import DaemonConfig
from logsync.defaults import (
    DEFAULT_DEBOUNCE_S,
    DEFAULT_ORIGINS_IN_FLIGHT,
)
from logsync.engine import RoundReport, error_kind
from logsync.errors import ConfigError, LogsyncError, PeerTransientError, StoreError
from logsync.holders import Holders
from logsync.peerloop import Claims, FullRound, NoRound, PeerLoop
from logsync.peerstate import PeerBook, PeerState
from logsync.peertask import PeerTask as _PeerTask
from logsync.peertask import direct_headers
from logsync.push import PushReport
from logsync.replica import identity_moved
from logsync.roundlog import LOGGED_ORIGIN_FAILURES, RoundLog, log_failure, named
from logsync.servelock import serving
from logsync.server import create_app
from logsync.server.commits import CommitWatch
from logsync.server.limits import check_tls, listen_socket, uvicorn_limits
from logsync.store import Store
from logsync.store.ledgers import LedgerTops
from logsync.watch import watch_stream

log = logging.getLogger("logsync.daemon")

PEERS_POLL_S = 1.0
PUSH_POLL_S = 1.0  # how often a push peer's loop looks for a change in our log
PUSH_BACKOFF_MAX_S = 300.0
STORE_CHECK_S = 5.0
STATE_SAVE_S = 1.0  # peer state is saved (fsync) at most this often, off the pull loops
GRACEFUL_SHUTDOWN_S = 3.0  # event streams never end on their own; cut them after this


class _QuietServer(uvicorn.Server):
    """uvicorn without its own signal handlers: the daemon owns SIGINT/SIGTERM."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class Daemon:
    """One replica: serves its store and pulls from every configured peer."""

    def __init__(self, config: DaemonConfig, *, rng: random.Random | None = None) -> None:
        config.check()
        self.config = config
        self._verify = tls_context(True, config.ca_file)  # a bad CA file: one sentence now
        self.store = Store.open(config.palace)
        self.book = PeerBook.load(config.palace)
        self._rng = rng or random.Random()
        self._tasks: dict[str, _PeerTask] = {}
        self.claims = Claims()  # origins being pulled, shared by every peer's loop
        self.holders = Holders()  # what each peer holds: no stream frame for it
        self.store_fault: str | None = None  # a local store fault: pulls pause, /sync/* 503
        self.identity_change: str | None = None  # why the daemon stopped itself, if it did
        self._next_store_check = 0.0
        self._store_healthy: anyio.Event | None = None  # made in run(): needs the loop
        self._state_dirty: anyio.Event | None = None  # made in run(): a save is owed
        self._peers_signature: tuple[int, int] | None = ("unread",)  # type: ignore[assignment]
        self.round_log = RoundLog()
        self.app = create_app(
            self.store, token=config.token, peer_state_provider=self.peer_entries,
            bind_host=config.host, port=config.port or None,
            extra_allowed_hosts=config.extra_hosts, sync_interval_s=config.interval,
            scheme="https" if config.tls_cert else "http",
            health=lambda: self.store_fault,
            op_cache_bytes=config.cache_bytes()[0], page_cache_bytes=config.cache_bytes()[1],
        )
        self.server = _QuietServer(uvicorn.Config(
            self.app, host=config.host, port=config.port, log_level=config.log_level,
            ssl_certfile=config.tls_cert, ssl_keyfile=config.tls_key, access_log=False,
            lifespan="on", timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S, ws="none",
            **uvicorn_limits(),  # head deadline, connection cap, keep-alive (server.limits)
        ))
        self.app.state.holders = self.holders  # read by the change stream
        self.app.state.frame_coalesce_s = config.coalesce
        # Event streams end by themselves once uvicorn is told to exit (no cancel, no
        # traceback); Daemon._on_signals may also call app.state.logsync.begin_shutdown().
        self.app.state.logsync.exit_probe = lambda: self.server.should_exit

    # ── the task tree ─────────────────────────────────────────────────

    async def run(self) -> None:
        """Serve and pull until SIGINT/SIGTERM."""
        self._store_healthy = anyio.Event()
        self._store_healthy.set()
        self._state_dirty = anyio.Event()
        commits = None
        if self.config.commit_check > 0:  # a CLI append wakes the streams within ms
            commits = CommitWatch(self.store.db_path, self.app.state.notifier.notify,
                                  interval=self.config.commit_check)
            commits.start()
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._on_signals, tg)
                pulls = anyio.CancelScope()
                tg.start_soon(self._pull_all, pulls)
                await self.server.serve()
                pulls.cancel()
                tg.cancel_scope.cancel()
        finally:
            if commits is not None:
                commits.stop()
        self._save_state()

    async def _on_signals(self, tg: TaskGroup) -> None:
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for signum in signals:
                name = signal.Signals(signum).name
                log.info("received %s: stopping pulls, then the server", name)
                self.app.state.logsync.begin_shutdown()
                self._stop_pulls()
                self.server.should_exit = True
                return

    def _stop_pulls(self) -> None:
        for task in self._tasks.values():
            task.scope.cancel()

    async def _pull_all(self, scope: anyio.CancelScope) -> None:
        with scope:
            # uvicorn exposes `started` as a flag, not an event: poll it briefly.
            while not self.server.started and not self.server.should_exit:  # noqa: ASYNC110
                await anyio.sleep(0.02)
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._state_saver)
                while True:
                    self._reload_peers(tg)
                    if self.store_fault is not None:
                        await self._check_store()
                    if self._identity_changed():
                        self._stop_for(self.identity_change or "")
                        return
                    await anyio.sleep(PEERS_POLL_S)

    def _identity_changed(self) -> bool:
        """`logsync reidentify` ran on our palace (`replica.identity_moved`): serving or
        signing on as the old id would mix two identities, so the daemon stops (exit 1)
        and its supervisor starts it again under the new one. So it does when the store's
        file was deleted or replaced (`Store.file_replaced`): it would write to the old."""
        self.identity_change = (identity_moved(self.config.palace, self.store.replica_id)
                                or self.store.file_replaced())
        return self.identity_change is not None

    def _stop_for(self, reason: str) -> None:
        log.error("%s", reason)
        self.app.state.logsync.begin_shutdown()
        self._stop_pulls()
        self.server.should_exit = True

    # ── the store's health ────────────────────────────────────────────

    def _store_failed(self, exc: StoreError) -> None:
        if self.store_fault is None:
            log.error("the store failed: %s; pulls pause until it is fixed (checked every "
                      "%g s), /sync/* answers 503 meanwhile", exc, STORE_CHECK_S)
            self._store_healthy = anyio.Event()
            self._next_store_check = anyio.current_time() + STORE_CHECK_S
        self.store_fault = str(exc)

    async def _check_store(self) -> None:
        if anyio.current_time() < self._next_store_check:
            return
        self._next_store_check = anyio.current_time() + STORE_CHECK_S
        try:
            problem = await anyio.to_thread.run_sync(self.store.health_problem)
        except Exception as exc:  # noqa: BLE001 - a failing check is a failed check
            problem = str(exc) or type(exc).__name__
        if problem is None:
            log.info("the store is healthy again: pulls resume")
            self.store_fault = None
            if self._store_healthy is not None:
                self._store_healthy.set()
        else:
            self.store_fault = problem

    def _reload_peers(self, tg: TaskGroup) -> None:
        """Start loops for new peers and stop them for removed ones, when peers.json changes."""
        signature = peers_mod.file_signature(self.config.palace)
        if signature == self._peers_signature:
            return
        self._peers_signature = signature
        try:
            wanted = {p.key: p for p in peers_mod.load_peers(self.config.palace)}
        except ConfigError as exc:
            log.error("%s; keeping the current peers", exc)
            return
        for key, task in list(self._tasks.items()):
            if wanted.get(key) != task.peer:
                task.scope.cancel()
                del self._tasks[key]
        self.book.retain(set(wanted))
        for key, peer in wanted.items():
            if key not in self._tasks:
                task = _PeerTask(peer=peer, scope=anyio.CancelScope(),
                                 loop=self._new_loop())
                self._tasks[key] = task
                tg.start_soon(self._peer_scope, task)

    def _new_loop(self) -> PeerLoop:
        return PeerLoop.make(self.store.replica_id, self.claims, self._rng,
                             interval=self.config.interval, debounce=DEFAULT_DEBOUNCE_S)

    async def _peer_scope(self, task: _PeerTask) -> None:
        with task.scope:
            async with anyio.create_task_group() as tg:
                if self.config.notifications:
                    tg.start_soon(self._watch, task)
                if task.peer.push:
                    tg.start_soon(self._push_loop, task)
                await self._pull_loop(task)

    async def _push_loop(self, task: _PeerTask) -> None:
        """For a peer marked `"push": true` (it cannot reach us): push what it lacks when
        our log changes (a local append, or ops pulled from elsewhere) and every interval
        anyway; after a failure, wait longer each time, up to `PUSH_BACKOFF_MAX_S`."""
        peer, state = task.peer, self.book.get(task.peer.key, task.peer.url)
        seen: object = ("never",)
        last, wait = -math.inf, 0.0
        told_unsupported = False
        async with PeerClient(peer.url, peer.token, name=task.label,
                              ca_file=self.config.ca_file, rng=self._rng) as client:
            while True:
                await anyio.sleep(PUSH_POLL_S)
                if self._store_healthy is not None:
                    await self._store_healthy.wait()
                marker = await anyio.to_thread.run_sync(self.store.latest_event_id)
                now = anyio.current_time()
                if now < last + wait or (marker == seen and now < last + self.config.interval):
                    continue
                last = now
                report = PushReport(peer=task.label)
                try:
                    await client.run_push(self.store, report=report)
                except Exception as exc:  # noqa: BLE001 - invariant 9: the peer's fault
                    wait = min(max(2 * wait, self.config.interval), PUSH_BACKOFF_MAX_S)
                    log.warning("%s", named(task.label, f"push failed: {exc}"))
                    continue
                seen, wait = marker, 0.0
                state.record_push(report, time.time())
                if report.supported is False and not told_unsupported:
                    told_unsupported = True
                    log.warning("peer %s takes no pushes (no 'push' extension): it must pull "
                                "from this replica", task.label)
                if report.pushed:
                    log.info("peer %s: pushed +%d events", task.label, report.pushed)
                for origin, reason in list(report.stopped().items())[:LOGGED_ORIGIN_FAILURES]:
                    log.warning("%s", named(task.label, f"push of origin {origin} stopped: "
                                                         f"{reason}"))
                self._save_soon()

    async def _watch(self, task: _PeerTask) -> None:
        await watch_stream(task.peer.url, task.peer.token, task.note, rng=self._rng,
                           verify=self._verify,
                           replica=self.store.replica_id,
                           on_page=functools.partial(self._take_pages, task),
                           direct=functools.partial(self._direct, task))

    def _direct(self, task: _PeerTask) -> dict[str, str]:
        """The origins we stream from directly, named to `task`'s peer (`outbox.py`)."""
        return direct_headers((t.replica for t in self._tasks.values()), task.replica)

    async def _take_pages(self, task: _PeerTask, pages: list[bytes],
                          announced: str | None) -> None:
        """Page frames from the peer's stream (`peertask.take_pages`); a store fault
        pauses pulls as a round's would."""
        try:
            await task.take_pages(pages, self.store, self.holders, self.app.state.notifier.notify,
                                 paused=self.store_fault is not None, announced=announced)
        except StoreError as exc:
            self._store_failed(exc)

    # ── one peer ──────────────────────────────────────────────────────

    async def _pull_loop(self, task: _PeerTask) -> None:
        """Carry out the peer loop's plans: wait until due, then run the round it names."""
        task.loop.start(anyio.current_time())
        peer = task.peer
        async with PeerClient(peer.url, peer.token, name=task.label,
                              ca_file=self.config.ca_file, rng=self._rng) as client:
            while True:
                await self._wait_until_due(task)
                if self._store_healthy is not None:
                    await self._store_healthy.wait()
                await self._one_round(client, task)

    async def _wait_until_due(self, task: _PeerTask) -> None:
        while not task.loop.is_due(anyio.current_time()):
            wait = task.loop.wait_time(anyio.current_time())
            with anyio.move_on_after(wait if wait is not None else PEERS_POLL_S):
                await task.wake.wait()
            if task.wake.is_set():
                task.wake = anyio.Event()

    async def _one_round(self, client: PeerClient, task: _PeerTask) -> None:
        """The round the peer loop plans: full, targeted, or none."""
        state = self.book.get(task.peer.key, task.peer.url)
        state.record_attempt(time.time())
        report = RoundReport(peer=task.label)
        try:
            local = await anyio.to_thread.run_sync(self.store.version_vector)
            plan = task.loop.begin(anyio.current_time(), local)
            if isinstance(plan, NoRound):  # nothing to pull now: no request, no news
                return
            failure: Exception | None = None
            live = self.holders.running(task.replica, report)  # first round: its report's
            async with anyio.create_task_group() as watcher:
                watcher.start_soon(self._catching_up, task, state, report)
                try:
                    if isinstance(plan, FullRound):
                        await client.run_round(self.store, report=report,
                                               held_back=plan.held_back)
                    else:
                        await client.run_targeted(self.store, plan.targets, plan.extensions,
                                                  origins_in_flight=DEFAULT_ORIGINS_IN_FLIGHT,
                                                  report=report)
                except Exception as exc:  # noqa: BLE001 - kept, so the group cannot wrap it
                    failure = exc
                finally:
                    watcher.cancel_scope.cancel()
                    self.holders.finished(live)
            task.replica = report.peer_replica or task.replica
            if failure is not None:
                raise failure
            # read here, off the loop and under the round's fault handling (a store fault)
            tops = await anyio.to_thread.run_sync(self.store.ledger_tops) \
                if report.conflicts or report.quarantined else None
        except Exception as exc:  # noqa: BLE001 - invariant 9: nothing leaves this loop
            self._round_failed(task, state, report, exc)
        except BaseException:  # cancelled: the peer was removed or changed, or we stop
            task.loop.abandon(anyio.current_time())
            raise
        else:
            task.loop.succeeded(report, anyio.current_time())
            self._record(task, state, report, full=isinstance(plan, FullRound),
                         ledger_tops=tops)
        self._save_soon()

    async def _catching_up(self, task: _PeerTask, state: PeerState,
                           report: RoundReport) -> None:
        """While a long round runs: a log line and the `catchup` entry `status` shows,
        every `progress.EVERY_S` seconds once it has applied something."""
        began, began_wall = anyio.current_time(), time.time()
        while True:
            await anyio.sleep(progress.EVERY_S)
            snap = progress.snapshot(report)
            if not snap.done or snap.done >= snap.total:
                continue
            log.info("%s", progress.line("catching up from", task.label, snap,
                                         anyio.current_time() - began))
            state.record_progress(snap.done, snap.total, began_wall, time.time())
            await anyio.to_thread.run_sync(self._save_state)  # its own task: no round waits

    def _round_failed(self, task: _PeerTask, state: PeerState, report: RoundReport,
                      exc: Exception) -> None:
        """Record and back off; the peer's loop, the server and every other peer go on."""
        kind = error_kind(exc)
        if isinstance(exc, StoreError):
            self._store_failed(exc)
        log_failure(task.label, exc, kind)
        state.record_failure(exc, time.time(), report)
        hint = exc.retry_after if isinstance(exc, PeerTransientError) else None
        task.loop.failed(report, anyio.current_time(), hint)

    def _record(self, task: _PeerTask, state: PeerState, report: RoundReport, *,
                full: bool, ledger_tops: LedgerTops | None = None) -> None:
        skipped_changed = full and report.skipped_origins != state.skipped_origins
        if full:
            state.record_success(report, time.time())
        else:
            state.record_targeted(report, time.time())
        if report.applied:
            self.app.state.notifier.notify()
        self.round_log.ended(task.label, report, skipped_changed=skipped_changed,
                             ledger_tops=ledger_tops)

    # ── state shared with the server and `logsync status` ─────────────

    def peer_entries(self) -> list[dict[str, Any]]:
        local = self.store.version_vector()
        return [s.as_upstream_peer_entry(local) for _, s in sorted(self.book.peers.items())]

    def _save_soon(self) -> None:
        """Owe a save of the peer state: `_state_saver` writes it, so no round waits for
        an fsync (a frame arriving meanwhile is pulled at once); `run` saves at exit."""
        if self._state_dirty is not None:
            self._state_dirty.set()

    async def _state_saver(self) -> None:
        """Save the peer state when a round changed it, at most once per STATE_SAVE_S."""
        while self._state_dirty is not None:
            await self._state_dirty.wait()
            self._state_dirty = anyio.Event()
            await anyio.to_thread.run_sync(self._save_state)
            await anyio.sleep(STATE_SAVE_S)

    def _save_state(self) -> None:
        try:
            self.book.save(self.config.palace)
        except (OSError, LogsyncError) as exc:
            log.error("cannot save peer state in %s: %s", self.config.palace, exc)


def serve(config: DaemonConfig, announce: Callable[[str], None] | None = None) -> None:
    """Run a daemon until a signal stops it (blocking).

    The TLS pair is loaded and the listening socket bound *before* the daemon starts, so a
    bad certificate or a port in use is one ``ConfigError`` sentence; ``announce`` (the
    CLI's banner) is called with the URL only once both have passed. uvicorn is handed
    the socket we bound, so nothing can take the port in between. An empty store joins by
    snapshot first (`join_before_serving`), with the port checked but not yet held.
    """
    config.check()
    check_tls(config.tls_cert, config.tls_key)
    with serving(config.palace):  # one daemon per palace
        _serve_locked(config, announce)


def _serve_locked(config: DaemonConfig, announce: Callable[[str], None] | None) -> None:
    if config.snapshot:
        # A port in use is one sentence now, not after a join; the port is bound for good
        # only after it, so peers (a fleet of empty daemons started together, each joining)
        # are refused at once while we join, never left waiting on an unserved socket.
        listen_socket(config.host, config.port).close()
        from logsync.snapshot.joining import join_before_serving

        if not join_before_serving(config.palace, config.ca_file):
            return  # stopped (SIGTERM) while joining
    sock = listen_socket(config.host, config.port)
    try:
        daemon = Daemon(config)
    except BaseException:
        sock.close()
        raise
    daemon.server.serve = functools.partial(daemon.server.serve, sockets=[sock])  # type: ignore[method-assign]
    if announce is not None:
        port = sock.getsockname()[1]
        host = f"[{config.host}]" if ":" in config.host else config.host
        announce(f"{'https' if config.tls_cert else 'http'}://{host}:{port}")
    try:
        anyio.run(daemon.run)
    finally:
        daemon.store.close()
        sock.close()
    if daemon.identity_change:  # exit 1, so a supervisor (Restart=on-failure) starts it again
        raise ConfigError(daemon.identity_change)
