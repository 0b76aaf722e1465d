"""Join a mesh from a snapshot (RFC 004 §9.6): download, check, install, then tail.

Only a store with no event at all joins this way, and only from a peer that advertises
`snapshot`; anything else (a MemPalace hub, a refused snapshot, a failed download) leaves
the store as it was and the ordinary pull takes over. The joiner keeps its own
`replica.json` and signing key: a snapshot is only the database file.

Install is a rename, crash-safe at every step: the download and every edit happen in a
temp file beside the store (removed at the next join if a kill leaves it); the live file
is then switched out of WAL mode, which SQLite allows only when no other connection has
it open (so nothing that could write is holding it), locked exclusively, found still
empty, and replaced by `os.replace`. A kill before the rename leaves the empty store
(back in WAL mode at its next open), after it the whole snapshot. A process that opened
the old file in between cannot write to it: SQLite refuses writes to a renamed file.
"""

from __future__ import annotations

import logging
import os
import signal
import sqlite3
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from logsync.errors import ConfigError, LogsyncError
from logsync.model import utc_now_iso
from logsync.peers import check_url, load_peers, redact_url
from logsync.snapshot import JOIN_PREFIX, SnapshotRefused
from logsync.snapshot.chaincheck import ChainProof
from logsync.snapshot.checking import (
    audit,
    check_integrity,
    check_readonly,
    prepare,
    verify_kept_signatures,
)
from logsync.snapshot.download import download_snapshot, look, open_client
from logsync.snapshot.making import remove_stale
from logsync.store import Store
from logsync.store.core import DB_FILENAME
from logsync.wire import parse_extensions

log = logging.getLogger("logsync.snapshot")

MAX_SNAPSHOT_BYTES = 64 * 1024**3
INSTALL_LOCK_TIMEOUT_S = 1.0
LOOK_S = 5.0  # one look at a peer's vector before joining from it


@dataclass(frozen=True)
class Joined:
    """A snapshot installed: from whom, what it held, how long it took."""

    peer: str
    peer_id: str
    events: int
    artifacts: int
    origins: int
    bytes: int
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        return {"peer": self.peer, "peer_replica": self.peer_id, "events": self.events,
                "artifacts": self.artifacts, "origins": self.origins, "bytes": self.bytes,
                "seconds": round(self.seconds, 3)}

    def line(self) -> str:
        return (f"joined from a snapshot of {self.peer} ({self.peer_id}): {self.events} "
                f"events, {self.artifacts} artifacts, {self.origins} origins, "
                f"{self.bytes} bytes in {self.seconds:.2f} s")


def is_empty(store: Store) -> bool:
    """No event at all: the only store a snapshot may replace."""
    return store.latest_event_id() is None


def join_if_empty(palace: Path, peers: Sequence[Any], *, ca_file: str | None = None,
                  timeout: float = 30.0, max_bytes: int = MAX_SNAPSHOT_BYTES,
                  say: Callable[[str], None] = log.warning) -> Joined | None:
    """Join from the first peer that advertises `snapshot`, if the store is empty and
    closed (the caller opens it after). A peer that does not answer its vector is passed
    over in silence (the pull that follows reports it). None: nothing installed (`say`
    was told why, if a snapshot was tried)."""
    palace = Path(palace)
    if _holds_events(palace / DB_FILENAME):
        return None  # the common case costs one indexed read, not a full open
    with Store.open(palace) as store:  # creates the palace, its id and key, as a pull would
        if not is_empty(store):
            return None
        own_id, own_key = store.replica_id, store.public_key
    remove_stale(palace, JOIN_PREFIX)
    for peer in peers:
        label = getattr(peer, "name", None) or redact_url(peer.url)
        try:
            joined = _join_one(palace, peer, label, own_id, own_key, ca_file, timeout,
                               max_bytes)
        except SnapshotRefused as exc:
            say(f"snapshot from {label} refused: {exc}; pulling op by op instead")
            return None
        except (LogsyncError, OSError) as exc:
            say(f"snapshot from {label} not taken: {exc}; pulling op by op instead")
            return None
        if joined is not None:
            return joined
    return None


def _holds_events(db_path: Path) -> bool:
    if not db_path.is_file():
        return False
    try:
        conn = sqlite3.connect(f"{db_path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            return conn.execute("SELECT 1 FROM events LIMIT 1").fetchone() is not None
        finally:
            conn.close()
    except sqlite3.Error:
        return False  # Store.open below says what is wrong with it


def _join_one(palace: Path, peer: Any, label: str, own_id: str, own_key: bytes | None,
              ca_file: str | None, request_timeout: float, max_bytes: int) -> Joined | None:
    began = time.monotonic()
    url = check_url(peer.url)
    tls: Any = False
    if ca_file or url.startswith("https:"):
        from logsync.client import tls_context

        tls = tls_context(True, ca_file)
    with open_client(url, peer.token, tls=tls, timeout=request_timeout) as http:
        # One short look, no retries: a peer that is down, or starting (joining itself),
        # costs LOOK_S once, so a fleet of empty daemons started together never waits on
        # each other; a peer that does not answer is left to the pull that follows.
        answer = look(http, LOOK_S)
        if not isinstance(answer, dict) or not parse_extensions(answer).snapshot:
            return None  # a hub, or a logsync peer that serves none: the ordinary pull
        vector = answer.get("version_vector")
        if not isinstance(vector, dict) or not any(isinstance(n, int) and n > 0
                                                   for n in vector.values()):
            return None  # nothing to join: an empty peer (a fleet started together)
        log.info("joining from %s's snapshot (an empty store); --no-snapshot pulls op by op",
                 label)
        fd, name = tempfile.mkstemp(prefix=JOIN_PREFIX, suffix=".sqlite3", dir=palace)
        os.close(fd)
        candidate = Path(name)
        try:
            preamble = download_snapshot(http, candidate, max_bytes, name=label)
            if preamble["replica_id"] != answer.get("replica_id"):
                raise SnapshotRefused(f"it names replica {preamble['replica_id']}, not the "
                                      f"{answer.get('replica_id')} that answered the vector")
            held = _check_and_install(candidate, palace, preamble, own_id, own_key)
        finally:
            candidate.unlink(missing_ok=True)
    return Joined(label, preamble["replica_id"], held["events"], held["artifacts"],
                  held["origins"], preamble["size"], time.monotonic() - began)


def _check_and_install(candidate: Path, palace: Path, preamble: dict[str, Any], own_id: str,
                       own_key: bytes | None) -> dict[str, Any]:
    check_readonly(candidate, preamble["vector"], own_id)
    # SQLite's integrity check (C, without the GIL) runs in a thread while the chains are
    # proven (`chaincheck`, Python holding the GIL): half the ranges in a forked child
    # when this process has no other thread yet (the CLI), the rest here; then the kept
    # signatures are checked, all on the file as downloaded, and all must pass before
    # anything is installed. Then the candidate is made ours and audited (signatures,
    # artifacts, gaps, and the reference recomputation of any chain not proven). No
    # other Python thread runs beside the proof: SQLite gives the GIL up at every row,
    # and another thread (a second range, or the signatures) then takes it for up to a
    # switch interval each time; the signatures beside the proof measured 0.11 s and the
    # proof half again slower, after it 0.03 s (20 000 ops). The download was not
    # fsynced: its flush to disk starts now.
    with ChainProof(candidate, fork=True) as proof, \
            ThreadPoolExecutor(max_workers=2, thread_name_prefix="snapshot-check") as pool:
        integrity = pool.submit(check_integrity, candidate)
        flushed = pool.submit(_fsync, candidate)
        try:
            proven = proof.finish()
            verified = verify_kept_signatures(candidate, own_id, preamble["replica_id"])
        finally:
            failed = integrity.exception()  # waits: nothing writes while a check reads
            if failed is not None:
                raise failed  # a file SQLite finds corrupt: that is the reason given
        flushed.result()
    prepare(candidate, own_id, own_key, preamble["replica_id"],
            utc_now_iso(int(time.time() * 1000)))
    held = audit(candidate, proven, verified)
    _fsync(candidate)
    install(candidate, palace / DB_FILENAME)
    return held


def install(candidate: Path, db_path: Path) -> None:
    """Replace the empty, closed store by `candidate` (module docstring: why it is safe)."""
    conn = sqlite3.connect(db_path, isolation_level=None, timeout=INSTALL_LOCK_TIMEOUT_S)
    try:
        try:
            mode = conn.execute("PRAGMA journal_mode=DELETE").fetchone()[0]
            conn.execute("BEGIN EXCLUSIVE")
        except sqlite3.OperationalError as exc:
            raise SnapshotRefused(f"the store {db_path} is open in another process ({exc}), "
                                  "so it cannot be replaced") from None
        if str(mode).lower() != "delete":
            raise SnapshotRefused(f"the store {db_path} stays in {mode} mode, so another "
                                  "process has it open")
        if conn.execute("SELECT 1 FROM events LIMIT 1").fetchone() is not None:
            raise SnapshotRefused(f"the store {db_path} is no longer empty")
        if _stopping is not None:
            _stopping.armed = False  # a SIGTERM from here on stops the daemon after the join
        os.replace(candidate, db_path)  # the commit point
        _fsync(db_path.parent)
    finally:
        conn.close()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _StoppedWhileJoining(BaseException):
    """SIGTERM arrived during the join (raised by its handler, so the download ends and
    its file goes as the stack unwinds)."""


class _StopOnSignal:
    """A daemon's SIGTERM handler while it joins: it ends the join (raises) only while
    armed; `install` disarms it just before its commit point, and so does the join's end,
    so a late signal only asks the daemon to stop once the join has returned."""

    def __init__(self) -> None:
        self.armed, self.requested = True, False

    def __call__(self, signum: int, frame: object) -> None:
        self.requested = True
        if self.armed:
            self.armed = False  # once: a second signal must not raise in the unwinding
            raise _StoppedWhileJoining


_stopping: _StopOnSignal | None = None  # the daemon's handler, while it joins


def join_before_serving(palace: Path, ca_file: str | None) -> bool:
    """A daemon's empty store joins from the first peer in peers.json that serves a
    snapshot, before the store is opened for serving and pulling (so the rename never
    races our own connections); any failure is one log line, and the ordinary pulls take
    over. False: SIGTERM came meanwhile (before the commit point nothing is installed);
    the daemon ends as if stopped while serving."""
    global _stopping
    try:
        peers = load_peers(palace)
    except ConfigError:
        return True  # the peer loops report it
    main = threading.current_thread() is threading.main_thread()
    stop = _StopOnSignal()
    previous = signal.signal(signal.SIGTERM, stop) if main else None
    _stopping = stop if main else None
    try:
        joined = join_if_empty(palace, peers, ca_file=ca_file, say=log.warning)
    except _StoppedWhileJoining:
        log.info("stopped (SIGTERM) while joining: nothing installed")
        return False
    finally:
        stop.armed = False
        _stopping = None
        if main:
            signal.signal(signal.SIGTERM, previous)
    if joined is not None:
        log.info("%s", joined.line())
    if stop.requested:
        log.info("stopped (SIGTERM) while joining, after the snapshot was installed")
        return False
    return True
