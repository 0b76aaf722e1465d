"""WAL checkpoints beside a bulk write instead of inside it.

Why: SQLite copies its write-ahead log into the database file (a checkpoint) when a commit
leaves the log over `wal_autocheckpoint` pages, and that commit waits for the copy. In a
pull of 20 000 ops (a 66 MB log) the copies were about a third of the writer's time
(benchmarks/apply.py). While a store is in *bulk* mode (a pull fetching pages ahead,
`prefetch.Prefetcher`), the writer's automatic checkpoints are off and a checkpointer
thread with its own connection copies the log while the writer goes on: a `PASSIVE`
checkpoint never blocks the writer or a reader, and SQLite copies without the GIL.

Bounds: the log does not grow past about `BULK_LOG_BYTES`. A checkpoint beside a busy
writer rarely lets the log start over (SQLite restarts it only at a transaction that
begins with every frame copied), so a commit that finds the log file over the bound copies
what is left itself, holding the write lock, as an automatic checkpoint would. The next
transaction then starts the log over (unless a reader still uses it: the same limit
SQLite's own checkpoints have) and the writer's `journal_size_limit` (`LOG_FILE_LIMIT`)
cuts the file back, so above that limit the file's size is the log's. When the last bulk
ends, the thread copies what is left once more and stops, and the writer's automatic
checkpoints come back at its next transaction. One thread per store, only while in bulk
(none if none can be started: the writer's own checkpoints then stay on); `close`
interrupts and joins it.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("logsync.store")

DEFAULT_AUTOCHECKPOINT = 1000  # SQLite's default, pages
BULK_LOG_BYTES = 64 * 1024 * 1024
# The writer's journal_size_limit: a log that starts over cuts its file back to this, so
# the file's size is the log's above it (the bound reads it) and a bulk leaves no 64 MiB
# file behind. At most BULK_LOG_BYTES.
LOG_FILE_LIMIT = 4 * 1024 * 1024
JOIN_TIMEOUT_S = 30.0  # close waits this long for a checkpoint it interrupted


@dataclass(frozen=True)
class LogState:
    """What an operator sees of the write-ahead log (`/metrics`, the status page): its
    file's size, the checkpoints bulk mode ran, those another connection kept busy, and
    those that failed, with the last failure's sentence (cleared by the next copy)."""

    log_bytes: int
    checkpoints: int
    busy: int
    failures: int
    failure: str | None


class Checkpointer:
    """The store's bulk mode and its checkpointer thread. `connect` makes a new
    connection to the store (the checkpointer's own, closed with the store's)."""

    def __init__(self, connect: Callable[[], sqlite3.Connection], log: Path) -> None:
        self._connect = connect
        self._log = log  # the `-wal` file
        self._lock = threading.Lock()  # the bulk count, the thread, its connection
        self._copying = threading.Lock()  # one checkpoint at a time
        self._wake = threading.Event()
        self._tally = threading.Lock()  # the counts below and `failure`, read as one
        self._bulk = 0
        self._thread: threading.Thread | None = None
        self._conn: sqlite3.Connection | None = None
        self._closed = False
        self.checkpoints = 0  # checkpoints run (by the thread and by commits)
        self.busy = 0  # checkpoints another connection (another process) kept busy
        self.failures = 0  # checkpoints, threads or connections that failed
        self.failure: str | None = None  # the last failure's sentence (never raised)

    @property
    def bulk(self) -> bool:
        return self._bulk > 0

    def autocheckpoint(self) -> int:
        """What the writer's `wal_autocheckpoint` should be now: 0 while in bulk with the
        thread running (a thread that could not connect leaves the writer's own on)."""
        return 0 if self._bulk and self._thread is not None else DEFAULT_AUTOCHECKPOINT

    def enter(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._bulk += 1
            if self._thread is None or not self._thread.is_alive():
                self._wake.clear()
                thread = threading.Thread(target=self._run, daemon=True,
                                          name="logsync-checkpointer")
                try:
                    thread.start()
                except RuntimeError as exc:  # no thread to be had: the writer's own
                    self._failed(f"cannot start the checkpointer thread ({exc}): the writer copies "
                                 "the log itself")
                    self._thread = None  # checkpoints stay on (`autocheckpoint`)
                    return
                self._thread = thread

    def leave(self) -> None:
        with self._lock:
            self._bulk = max(0, self._bulk - 1)
        self._wake.set()  # at the end of bulk: the last copy, then the thread stops

    def committed(self, writer: sqlite3.Connection) -> None:
        """After a commit in bulk mode (the write lock held): wake the thread; past the
        bound, copy what is left here so the next transaction restarts the log."""
        if not self._bulk:
            return
        try:
            size = os.stat(self._log).st_size
        except OSError:
            size = 0
        if size > BULK_LOG_BYTES:
            with self._copying:
                self._checkpoint(writer)
        self._wake.set()

    def wait(self, timeout: float) -> bool:
        """Wait up to `timeout` s for the thread to finish its last copy; whether it did
        (benchmarks time a pull until its log is copied)."""
        with self._lock:
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
            return not thread.is_alive()
        return True

    def close(self) -> None:
        """Stop the thread (interrupting a checkpoint in progress), wait for it, and close
        its connection first: an interrupt it did not use would otherwise stay pending,
        and were it the store's last connection, abort the checkpoint SQLite makes when
        the last one closes, leaving the log beside the database."""
        with self._lock:
            self._closed, self._bulk = True, 0
            thread, conn = self._thread, self._conn
        self._wake.set()
        running = thread is not None and thread.is_alive()
        if conn is not None and running:
            with suppress(sqlite3.Error):
                conn.interrupt()
        if running and thread is not threading.current_thread():
            thread.join(JOIN_TIMEOUT_S)
        if conn is not None and not (thread is not None and thread.is_alive()):
            with suppress(sqlite3.Error):
                conn.close()  # the store closes it too (again: harmless)

    def _run(self) -> None:
        conn = self._conn
        if conn is None:  # one connection for the store's life, however many bulks
            try:
                conn = self._connect()
            except Exception as exc:  # noqa: BLE001 - the writer's automatic checkpoints
                # stay on (`autocheckpoint`); the next bulk retries
                self._failed(f"the checkpointer cannot open the store ({exc}): the writer "
                             "copies the log itself")
                with self._lock:
                    self._thread = None
                return
            with self._lock:
                self._conn = conn
        while True:
            self._wake.wait()
            self._wake.clear()
            with self._lock:
                done = self._closed or not self._bulk
            if self._closed:
                return
            with self._copying:
                self._checkpoint(conn)
            if done:
                with self._lock:  # a bulk that began meanwhile keeps the thread
                    if self._bulk and not self._closed:
                        continue
                    self._thread = None
                    return

    def state(self) -> LogState:
        try:
            size = os.stat(self._log).st_size
        except OSError:
            size = 0
        with self._tally:
            return LogState(size, self.checkpoints, self.busy, self.failures, self.failure)

    def _checkpoint(self, conn: sqlite3.Connection) -> None:
        try:
            busy = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()[0]
        except sqlite3.Error as exc:  # closed, interrupted: the next one retries
            if not self._closed:  # close interrupts a copy on purpose
                self._failed(f"copying {self._log.name} into the database failed ({exc}): "
                             "the next commit tries again")
            return
        with self._tally:
            if busy:  # another connection (another process) was checkpointing: not a fault
                self.busy += 1
                return
            self.checkpoints += 1
            self.failure = None

    def _failed(self, sentence: str) -> None:
        """Count a failure and say it once (until a copy succeeds or it changes): the
        writer goes on either way, and a bulk's later commits would repeat it."""
        with self._tally:
            self.failures += 1
            said, self.failure = self.failure, sentence
        if sentence != said:
            log.warning("%s", sentence)
