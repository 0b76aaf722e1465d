"""One piece of CPU-bound work in a forked copy of this process, beside the caller's own.

Why: the join's chain proof is Python holding the GIL, and SQLite's integrity check
already takes the second core beside it, so a thread cannot help; a fresh interpreter
would spend its start and imports first (~0.2 s on the 2-core VM). A fork starts in
milliseconds with every module loaded.

Only a process with no other thread forks: a lock another thread holds at the fork
stays held forever in the child. Elsewhere (the daemon, with its event loop and worker
threads) `start` returns None and the caller does the work itself. The child runs one
function, writes its result as JSON to a pipe and leaves by `os._exit` (no atexit
handler, no flush of buffers it shares with the parent). A child that fails, dies,
writes more than `MAX_ANSWER_BYTES` or overruns its deadline is no answer (None); the
caller then does that work itself, so a fault never changes a result, only its time.
"""

from __future__ import annotations

import json
import os
import select
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

MAX_ANSWER_BYTES = 1024 * 1024


def may_fork() -> bool:
    """A fork is safe here: the platform has one and this process runs one thread."""
    return hasattr(os, "fork") and threading.active_count() == 1


class Forked:
    """A forked child computing one value; close() kills and reaps it if still running."""

    def __init__(self, pid: int, fd: int) -> None:
        self._pid: int | None = pid
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
        try:
            pid = os.fork()
        except OSError:
            os.close(read_fd)
            os.close(write_fd)
            return None
        if pid == 0:  # the child: never returns into the caller's code
            code = 1
            try:
                os.close(read_fd)
                for stop in (signal.SIGINT, signal.SIGTERM):  # not the parent's handlers:
                    signal.signal(stop, signal.SIG_DFL)  # Ctrl-C or a stop ends it at once
                view = memoryview(json.dumps(work()).encode())
                while view:
                    view = view[os.write(write_fd, view):]
                code = 0
            finally:
                os._exit(code)
        os.close(write_fd)
        return cls(pid, read_fd)

    def result(self, deadline_s: float) -> Any | None:
        """The child's value, waiting at most `deadline_s`; None for no answer."""
        if self._fd is None:
            return None
        end, answer = time.monotonic() + deadline_s, bytearray()
        while True:
            left = end - time.monotonic()
            if left <= 0:
                self.close()
                return None
            ready, _, _ = select.select([self._fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(self._fd, 65536)
            if not chunk:
                break
            answer += chunk
            if len(answer) > MAX_ANSWER_BYTES:
                self.close()
                return None
        status = self._reap(kill=False)
        if status is None or not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0:
            return None
        try:
            return json.loads(answer)
        except ValueError:
            return None

    def close(self) -> None:
        self._reap(kill=True)

    def _reap(self, *, kill: bool) -> int | None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        pid, self._pid = self._pid, None
        if pid is None:
            return None
        if kill:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            return os.waitpid(pid, 0)[1]
        except ChildProcessError:
            return None

    def __enter__(self) -> Forked:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
