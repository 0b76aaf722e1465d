"""Commits by other processes (the CLI, an agent's own `Store`), noticed within milliseconds.

A writer in this process pokes the `ChangeNotifier` itself; a writer in another
process cannot. The event streams' shared probe of the newest event id catches it
every ``sse_poll_s`` (100 ms), which is most of a cross-process append's convergence
latency. `CommitWatch` closes that gap cheaply: `store.commitprobe.CommitProbe`, a
read-only connection of its own, asks SQLite's ``PRAGMA data_version`` every
``interval`` (a read of the WAL index in shared memory, no table touched), and a
changed value -- any other connection
committed -- pokes the notifier, which wakes the streams at once. The probe stays as
the safety net: a failing check is logged once and retried every ``RETRY_S``, and
the first good check after it notifies once, so the watch can only ever cost
latency, never an event.

It runs on a thread of its own (the notifier is thread-safe), so a slow disk never
stalls the event loop; every wait is bounded by ``interval`` and ``stop`` joins it.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path

from logsync.store.commitprobe import CommitProbe

log = logging.getLogger("logsync.server")

COMMIT_CHECK_S = 0.005  # how often data_version is read: 200 cheap reads a second
RETRY_S = 1.0  # after a failed check (the file gone, unreadable): retry this often
STOP_JOIN_S = 2.0


class CommitWatch:
    """Calls ``notify()`` soon after any connection to ``db_path`` but its own commits."""

    def __init__(self, db_path: Path, notify: Callable[[], None], *,
                 interval: float = COMMIT_CHECK_S) -> None:
        if not interval > 0:
            raise ValueError(f"interval={interval} is invalid: must be > 0 seconds")
        self._probe = CommitProbe(db_path, timeout=interval)
        self._notify = notify
        self._interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.checks = 0  # data_version reads so far (for tests and diagnostics)
        self.changes = 0  # how many of them found a commit

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="logsync-commits", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread; returns within ``interval`` plus one check (bounded anyway)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(STOP_JOIN_S)

    def _run(self) -> None:
        seen: int | None = None
        failing = False
        try:
            while not self._stop.wait(RETRY_S if failing else self._interval):
                try:
                    version = self._probe.version()
                except sqlite3.Error as exc:
                    if not failing:
                        log.warning("cannot watch the store for commits by other processes "
                                    "(%s); they are noticed by the streams' poll", exc)
                    failing, seen = True, None
                    continue
                self.checks += 1
                changed = seen is not None and version != seen
                self.changes += changed
                if changed or failing:  # after a failure: whatever happened meanwhile
                    self._notify()
                seen, failing = version, False
        finally:
            self._probe.close()
