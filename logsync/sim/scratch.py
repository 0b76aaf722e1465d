"""The directories simulation runs work in: each claimed by a lock for as long as its
owner lives, and those whose owner died removed by the next run.

Why: runs keep their stores in tmpfs, that is RAM. A run or sweep stopped by SIGKILL
(the OOM killer, a CI job's timeout, a power cut of the container) removes nothing, and
its stores would hold that memory until the machine restarts. The owner holds an
exclusive `flock` on `LOCK_NAME` inside its directory; the kernel releases it when the
owner dies, however it dies, whatever pid namespace it was in. `remove_abandoned` takes
that lock without waiting: taken, the owner is gone and the directory is removed; held,
it is in use and stays. The lock file appears under its name only once locked (made
under another name, locked, then renamed), so a directory being made is never taken for
an abandoned one. A directory without the lock file (another program's, or unreadable)
is left alone, and so is a sweep's directory whose parent died while a worker of it still
runs a seed in its own claimed directory inside.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

LOCK_NAME = ".logsync-owner.lock"
PREFIXES = ("logsync-sim-", "logsync-sweep-")
MAX_LOOKED_AT = 10_000  # entries of the scratch place looked at per call (it is shared)
MAKING_S = 60.0  # a run directory without its lock file this young may be being made


def scratch_base() -> Path:
    """tmpfs when there is one (the stores fsync), else the system's temp directory."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


@contextlib.contextmanager
def claimed_dir(prefix: str, base: Path | None = None) -> Iterator[Path]:
    """A fresh directory under `base` (default `scratch_base()`), locked as ours while
    the block runs and removed when it ends."""
    assert prefix in PREFIXES, prefix
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=base or scratch_base()))
    fd = -1
    try:
        making = path / f"{LOCK_NAME}.making"
        fd = os.open(making, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)  # a new file: nobody else can hold it
        os.rename(making, path / LOCK_NAME)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        if fd >= 0:
            os.close(fd)


def remove_abandoned(base: Path | None = None) -> list[str]:
    """Remove the run and sweep directories under `base` whose owner has died; their
    names. Never raises: what cannot be looked at or removed stays."""
    base = base or scratch_base()
    removed: list[str] = []
    try:
        entries = os.scandir(base)
    except OSError:
        return removed
    with entries:
        for looked, entry in enumerate(entries):
            if looked >= MAX_LOOKED_AT:
                break
            if entry.name.startswith(PREFIXES) and _abandoned_removed(Path(entry.path)):
                removed.append(entry.name)
    return removed


def _abandoned_removed(path: Path) -> bool:
    try:
        if path.is_symlink() or not path.is_dir():
            return False
        fd = os.open(path / LOCK_NAME, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return False  # no lock file: being made, another program's, or not ours to read
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False  # its owner lives
        if _holds_live_runs(path):
            return False  # a sweep's parent died, its workers have not (yet)
        shutil.rmtree(path, ignore_errors=True)
        return not path.exists()
    finally:
        os.close(fd)


def _holds_live_runs(sweep: Path) -> bool:
    """Whether a run directory inside `sweep` is still claimed, or perhaps being made
    (no lock file yet, and recent): a worker outlives its sweep's parent until its seed
    ends, and its stores must not be removed under it."""
    try:
        entries = list(os.scandir(sweep))[:MAX_LOOKED_AT]
    except OSError:
        return False
    for entry in entries:
        if not entry.name.startswith(PREFIXES) or not entry.is_dir(follow_symlinks=False):
            continue
        try:
            fd = os.open(Path(entry.path) / LOCK_NAME, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except FileNotFoundError:
            with contextlib.suppress(OSError):
                if time.time() - entry.stat(follow_symlinks=False).st_mtime < MAKING_S:
                    return True
            continue
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
        finally:
            os.close(fd)
    return False
