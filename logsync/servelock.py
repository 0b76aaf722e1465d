"""One daemon per palace: `logsync serve` holds an exclusive lock on a file in it.

Two daemons on one palace both pull, both push and both write `peer_state.json`, and
each answers for the store as if it were alone; nothing is lost (SQLite serialises the
writes), but every round is done twice and the saved peer state is whichever wrote last.
The lock is `flock(2)` on `<palace>/serve.lock`, so the kernel releases it when the
holder exits however it exits (kill -9 too): no stale lock to clean up. The file holds
the holder's pid, for the sentence a second daemon gets. On a file system without
`flock` the daemon serves without the lock (a warning), as before.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from logsync.errors import ConfigError
from logsync.files import make_private_dir

logger = logging.getLogger("logsync.daemon")

LOCK_FILENAME = "serve.lock"


@contextlib.contextmanager
def serving(palace: Path) -> Iterator[None]:
    """Hold `palace`'s serve lock while the block runs; another holder: one sentence."""
    palace = Path(palace)
    try:
        make_private_dir(palace)  # 0700 if made here, as the store makes it
        # never through a symlink: the pid written would land in whatever it names
        fd = os.open(palace / LOCK_FILENAME,
                     os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        why = "it is a symlink" if exc.errno == errno.ELOOP else exc.strerror or exc
        raise ConfigError(f"cannot open the serve lock {palace / LOCK_FILENAME}: {why}") \
            from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ConfigError(f"the serve lock {palace / LOCK_FILENAME} is not a regular file")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                logger.warning("cannot lock %s (%s): serving without it, so nothing stops a "
                               "second daemon on this palace", palace / LOCK_FILENAME,
                               exc.strerror or exc)
            else:
                holder = _holder(fd)
                raise ConfigError(
                    f"{palace} is already served by another logsync serve"
                    f"{f' (pid {holder})' if holder else ''}: stop it first, or serve "
                    "another palace") from None
        else:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def _holder(fd: int) -> int | None:
    """The pid the holder wrote, if it reads as one."""
    try:
        text = os.pread(fd, 32, 0).decode("ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() and len(text) < 12 else None
