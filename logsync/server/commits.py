"""Commits by other processes (the CLI, an agent's own `Store`), noticed within milliseconds.

A writer in this process pokes the `ChangeNotifier` itself; a writer in another
process cannot. The event streams' shared probe of the newest event id catches it
every ``sse_poll_s`` (100 ms), which is most of a cross-process append's convergence
latency. `CommitWatch` closes that gap cheaply: `store.commitprobe.CommitProbe`, a
read-only connection of its own, reads SQLite's ``PRAGMA data_version`` (the WAL index
in shared memory, no table touched), and a changed value -- any other connection
committed -- pokes the notifier, which wakes the streams at once.

When to read it: on Linux the kernel says when the store's files are written (inotify on
the palace directory, `inotify_simple`), so an idle daemon reads it only every
``IDLE_CHECK_S`` and a commit is seen as it lands; while commits keep coming it reads at
most once per ``interval``. After a write it keeps reading that often until a commit
shows, for at most ``SETTLE_S``: SQLite writes the WAL (inotify sees it), fsyncs it, and
then publishes the commit in shared memory (inotify cannot see that). Reading every 5 ms
instead cost an idle daemon 3.4 % of a core (93 % of its idle CPU). Where inotify is
missing or refuses (another OS, the per-user watch limit) it reads every ``interval``,
as before.

The probe stays the safety net: a failing check is logged once and retried every
``RETRY_S``, and the first good check after it notifies once, so the watch can only ever
cost latency, never an event. It runs on a thread of its own (the notifier is
thread-safe), so a slow disk never stalls the event loop; every wait is bounded and
``stop`` joins it.
"""

from __future__ import annotations

import logging
import sqlite3
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from logsync.store.commitprobe import CommitProbe

try:
    from inotify_simple import INotify, flags
except ImportError:  # not Linux: the watch polls
    INotify = None

log = logging.getLogger("logsync.server")

COMMIT_CHECK_S = 0.005  # at most one data_version read this often (every one, polling)
IDLE_CHECK_S = 0.25  # woken by the kernel: the check while no write is seen
# After a write is seen, read every `interval` until a commit shows, for at most this
# long: SQLite writes the WAL (which wakes us), fsyncs it, and only then publishes the
# commit in shared memory (which cannot), so a slow disk's fsync is waited out here.
SETTLE_S = 1.0
RETRY_S = 1.0  # after a failed check (the file gone, unreadable): retry this often
STOP_JOIN_S = 2.0


class CommitWatch:
    """Calls ``notify()`` soon after any connection to ``db_path`` but its own commits."""

    def __init__(self, db_path: Path, notify: Callable[[], None], *,
                 interval: float = COMMIT_CHECK_S, use_inotify: bool = True) -> None:
        if not interval > 0:
            raise ValueError(f"interval={interval} is invalid: must be > 0 seconds")
        self._db_path = Path(db_path)
        self._use_inotify = use_inotify
        self.woken_by_kernel = False  # whether inotify wakes it (else it polls)
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
        """Stop the thread; returns within ``IDLE_CHECK_S`` plus one check (bounded by
        ``STOP_JOIN_S`` anyway)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(STOP_JOIN_S)

    def _run(self) -> None:
        seen: int | None = None
        failing = False
        wake = _FileWake.open(self._db_path) if self._use_inotify else None
        self.woken_by_kernel = wake is not None
        last = settled = 0.0
        try:
            while not self._stop.is_set():
                woke = False
                if failing:
                    self._stop.wait(RETRY_S)
                elif wake is None:
                    self._stop.wait(self._interval)
                else:
                    settling = time.monotonic() < settled
                    woke = wake.wait(self._interval if settling else IDLE_CHECK_S)
                    if woke:  # every write (re)opens the window: its commit is yet to show
                        settled = time.monotonic() + SETTLE_S
                    since = time.monotonic() - last
                    if since < self._interval:  # writes keep coming: one check per interval
                        self._stop.wait(self._interval - since)
                if self._stop.is_set():
                    return
                last = time.monotonic()
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
                if changed and not woke:  # every write seen so far has shown
                    settled = 0.0
                self.changes += changed
                if changed or failing:  # after a failure: whatever happened meanwhile
                    self._notify()
                seen, failing = version, False
        finally:
            self._probe.close()
            if wake is not None:
                wake.close()


class _FileWake:
    """Wakes when the kernel reports a write to the store's files (inotify on the palace
    directory; only the database, its WAL and its journal count)."""

    MASK = 0
    if INotify is not None:
        MASK = flags.MODIFY | flags.CREATE | flags.MOVED_TO | flags.CLOSE_WRITE

    def __init__(self, notify: Any, names: frozenset[str]) -> None:
        self._inotify, self._names = notify, names

    @classmethod
    def open(cls, db_path: Path) -> _FileWake | None:
        """None where inotify is missing or refuses (logged once: the watch polls)."""
        if INotify is None or not sys.platform.startswith("linux"):
            return None  # inotify_simple imports elsewhere too, and then fails in use
        db_path = db_path.resolve()  # a symlinked store: its WAL is beside the target
        try:
            notify = INotify()
        except Exception as exc:  # OSError (the per-user limit), or no such syscall
            log.info("no inotify for the store's commits (%s): polling", exc)
            return None
        try:
            notify.add_watch(str(db_path.parent), cls.MASK)
        except Exception as exc:
            notify.close()
            log.info("cannot watch %s for commits (%s): polling", db_path.parent, exc)
            return None
        name = db_path.name
        return cls(notify, frozenset({name, f"{name}-wal", f"{name}-journal"}))

    def wait(self, timeout_s: float) -> bool:
        """Whether a store file was written within `timeout_s` (every queued event is
        read: one wake for a burst of writes; a queue overflow counts as a write)."""
        try:
            events = self._inotify.read(timeout=int(timeout_s * 1000))
        except OSError:
            return True  # a failed read costs one check, never a missed commit
        return any(e.name in self._names or e.mask & flags.Q_OVERFLOW for e in events)

    def close(self) -> None:
        self._inotify.close()
