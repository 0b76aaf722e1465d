"""One piece of CPU-bound work in a forked copy of this process, beside the caller's own.

Why: the join's chain proof is Python holding the GIL, and SQLite's integrity check
already takes the second core beside it, so a thread cannot help; a fresh interpreter
would spend its start and imports first (~0.2 s on the 2-core VM). A fork starts in
milliseconds with every module loaded.

Only a process running one thread forks (counted by the kernel where it can say, so a
thread started by C code counts too): a lock another thread holds at the fork stays
held forever in the child. The CLI's `sync` and a daemon's join before it serves fork;
anywhere else `start` returns None and the caller does the work itself.

The child runs one function with the garbage collector off (a collection could run a
finalizer of the parent's objects, e.g. close a connection the parent still uses),
writes its result as JSON to a pipe and leaves by `os._exit` (no atexit handler, no
flush of buffers it shares with the parent). It dies with its parent (on Linux the
kernel kills it). SIGINT and SIGTERM are blocked across the fork, so neither can reach
the child while it still runs the caller's code. A child that fails, dies, writes more
than `MAX_ANSWER_BYTES` or overruns its deadline is no answer (None); the caller then
does that work itself, so a fault never changes a result, only its time.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

MAX_ANSWER_BYTES = 1024 * 1024
_STOPS = {signal.SIGINT, signal.SIGTERM}
_PR_SET_PDEATHSIG = 1


def may_fork() -> bool:
    """A fork is safe here: the platform has one and this process runs one thread."""
    if not hasattr(os, "fork") or threading.active_count() != 1:
        return False
    try:
        return len(os.listdir("/proc/self/task")) == 1
    except OSError:
        return sys.platform != "linux"  # no /proc elsewhere: Python's own count


class Forked:
    """A forked child computing one value; close() kills and reaps it if still running."""

    def __init__(self, pid: int, fd: int) -> None:
        self.pid = pid
        self._running = True
        self._fd: int | None = fd

    @classmethod
    def start(cls, work: Callable[[], Any]) -> Forked | None:
        """Fork a child that returns `work()` (JSON-encodable); None when this process may
        not fork (`may_fork`) or the fork fails (the caller does the work)."""
        if not may_fork():
            return None
        try:
            read_fd, write_fd = os.pipe()
        except OSError:
            return None
        parent = os.getpid()
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, _STOPS)
        try:
            pid = os.fork()
        except OSError:
            os.close(read_fd)
            os.close(write_fd)
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
            return None
        if pid == 0:
            _child(parent, read_fd, write_fd, work, blocked)  # never returns
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        os.close(write_fd)
        return cls(pid, read_fd)

    def result(self, deadline_s: float) -> Any | None:
        """The child's value, waiting at most `deadline_s`; None for no answer."""
        try:
            answer = self._read(deadline_s)
        except (OSError, ValueError):
            answer = None
        if answer is None:
            self.close()
            return None
        status = self._reap(kill=False)
        if status is None or not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0:
            return None
        try:
            return json.loads(answer)
        except ValueError:
            return None

    def _read(self, deadline_s: float) -> bytes | None:
        if self._fd is None:
            return None
        end, answer = time.monotonic() + deadline_s, bytearray()
        poller = select.poll()  # not select(): a descriptor may be numbered past 1023
        poller.register(self._fd, select.POLLIN)
        while True:
            left = end - time.monotonic()
            if left <= 0:
                return None
            if not poller.poll(max(1, int(left * 1000))):
                continue
            chunk = os.read(self._fd, 65536)
            if not chunk:
                return bytes(answer)
            answer += chunk
            if len(answer) > MAX_ANSWER_BYTES:
                return None

    def close(self) -> None:
        self._reap(kill=True)

    def _reap(self, *, kill: bool) -> int | None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if not self._running:
            return None
        if kill:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            status = os.waitpid(self.pid, 0)[1]
        except ChildProcessError:
            status = None
        self._running = False  # only once reaped: an interrupted wait is retried by close
        return status

    def __enter__(self) -> Forked:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _child(parent: int, read_fd: int, write_fd: int, work: Callable[[], Any],
           blocked: set[signal.Signals]) -> None:
    code = 1
    try:
        gc.disable()
        os.close(read_fd)
        for stop in _STOPS:  # not the parent's handlers: a stop ends the child at once
            signal.signal(stop, signal.SIG_DFL)
        _die_with(parent)
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        view = memoryview(json.dumps(work()).encode())
        while view:
            view = view[os.write(write_fd, view):]
        code = 0
    finally:
        os._exit(code)


def _die_with(parent: int) -> None:
    """On Linux the kernel sends SIGKILL when the parent dies (even by kill -9); if it
    died before this was set, end now."""
    if sys.platform == "linux":
        try:  # prctl is libc's, linked into the interpreter
            ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:
        os._exit(1)
